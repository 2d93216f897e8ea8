//! The `ostiary` command line (DESIGN §7) driven as a user drives it: the real binary,
//! `ostiary serve` as a child process on free ports with a config file, and the other
//! subcommands run against it.
//!
//! What it proves:
//! - `session new` prints `export` lines that, eval'd by a shell, make plain `curl` go
//!   through the proxy with the token and trust its CA; allowed and denied requests both
//!   show up in `audit query` with their decisions; `--json` prints the session itself;
//! - `run` gives the child a working session, passes its exit code through, and revokes
//!   the session afterwards (the child's token then gets 407);
//! - `ca export` prints exactly the CA in the state directory;
//! - `audit verify` accepts an intact chain and rejects an edited record, a deleted middle
//!   record and a deleted newest record;
//! - `serve` with no config at all creates the state directory with private secrets and
//!   listens on the default ports;
//! - `policy validate` accepts the shipped library and names the broken file otherwise.
//! - `policy test` passes the shipped library's cases (exit 0), reports a failing case with
//!   expected vs got (exit 1), and exits 2 when there are no tests to run.
//!
//! The binary is built once per test process (`cargo build -p ostiary --bin ostiary`), so
//! the tests always run the current code.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use ostiary_e2e::clients::{self, CmdOutput};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// Allows `/echo` on `api.example.test` for every agent; anything else (including the
/// `other.example.test` host) falls to the default deny.
const POLICY: &str = r#"
@id("allow-demo-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };
"#;

/// How long a CLI command may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// How long `ostiary serve` may take to answer `/healthz`, and to exit after SIGTERM.
const SERVER_DEADLINE: Duration = Duration::from_secs(30);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_owned()
}

/// The `ostiary` binary, built once per test process so it matches the sources.
fn ostiary_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let root = workspace_root();
        let out = std::process::Command::new(cargo)
            .args([
                "build",
                "-p",
                "ostiary",
                "--bin",
                "ostiary",
                "--manifest-path",
            ])
            .arg(root.join("Cargo.toml"))
            .current_dir(&root)
            .output()
            .expect("running cargo build for the ostiary binary");
        assert!(
            out.status.success(),
            "cargo build -p ostiary --bin ostiary failed:\n{}",
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
async fn ostiary(args: &[&str]) -> CmdOutput {
    let bin = ostiary_bin();
    clients::run(bin, args, &[("OSTIARY_LOG", "warn")], CLI_TIMEOUT).await
}

/// A port that was free a moment ago (bound on 127.0.0.1:0 and released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// `GET /healthz` on the control listener answers 200.
async fn healthy(control: SocketAddr) -> bool {
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
struct Server {
    child: Child,
    /// Holds the config, the state directory, the policies and the server's log.
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    proxy_addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    /// Starts `ostiary --config <file> serve` for a proxy that trusts `upstream`'s CA, may
    /// reach its port, and resolves `names` to 127.0.0.1. Free ports are picked by binding
    /// port 0; if another process takes one in between, the start is retried.
    async fn start(upstream: &Upstream, names: &[&str], policy: &str) -> Self {
        let mut dir = tempfile::tempdir().unwrap();
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(policies.join("test.cedar"), policy).unwrap();
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

[state]
dir = "{state}"

[policy]
dir = "{policies}"

[egress]
ports = [80, 443, {port}]
allow_private = ["127.0.0.1/32"]
resolve = {{ {resolve} }}
ca_file = "{ca_file}"
"#,
                state = state.display(),
                policies = policies.display(),
                port = upstream.port(),
                resolve = resolve.join(", "),
                ca_file = ca_file.display(),
            );
            std::fs::write(&config, text).unwrap();
            let child = spawn_serve(Some(&config), None, &log);
            let mut server = Server {
                child,
                dir,
                config: config.clone(),
                state: state.clone(),
                proxy_addr,
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
    async fn wait_healthy(&mut self, control: SocketAddr) -> Result<(), String> {
        wait_healthy(&mut self.child, control, &self.log).await
    }

    fn config_arg(&self) -> String {
        self.config.display().to_string()
    }

    /// Stops the server with SIGTERM and waits for a clean exit, so every audit record
    /// is committed and the head checkpoint written.
    async fn stop(mut self) -> tempfile::TempDir {
        terminate(&mut self.child, &self.log).await;
        self.dir
    }
}

fn spawn_serve(config: Option<&Path>, cwd: Option<&Path>, log: &Path) -> Child {
    let log_file = std::fs::File::create(log).expect("creating the server log");
    let mut cmd = Command::new(ostiary_bin());
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    cmd.arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file.try_clone().unwrap()))
        .stderr(Stdio::from(log_file))
        .env("OSTIARY_LOG", "info")
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

async fn wait_healthy(child: &mut Child, control: SocketAddr, log: &Path) -> Result<(), String> {
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

async fn terminate(child: &mut Child, log: &Path) {
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
fn parse_env(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The body and status of `curl -w '\n%{http_code}'` output.
fn body_and_code(out: &CmdOutput) -> (Value, String) {
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
async fn audit_query(
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

fn of_kind<'a>(records: &'a [Value], kind: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["kind"] == kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_new_exports_drive_curl_and_both_outcomes_are_audited() {
    let upstream = Upstream::builder()
        .names(&["api.example.test", "other.example.test"])
        .start()
        .await;
    let server = Server::start(
        &upstream,
        &["api.example.test", "other.example.test"],
        POLICY,
    )
    .await;
    let config = server.config_arg();

    let out = ostiary(&["--config", &config, "session", "new", "--agent", "demo"]).await;
    assert!(out.success(), "{out}");
    let mut lines = out.stdout.lines();
    let header = lines.next().unwrap_or_default();
    assert!(
        header.starts_with("# Ostiary session ") && header.ends_with(" for agent demo"),
        "{out}"
    );
    for line in lines {
        assert!(
            line.starts_with("export "),
            "only export lines follow: {line:?}\n{out}"
        );
    }
    let exports = server.dir.path().join("exports.sh");
    std::fs::write(&exports, &out.stdout).unwrap();
    let exports_arg = exports.display().to_string();

    // What a shell gets after eval'ing them.
    let env = clients::run(
        "bash",
        &["-c", "source \"$1\" && env", "_", &exports_arg],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(env.success(), "{env}");
    let env = parse_env(&env.stdout);
    let session_id = env.get("OSTIARY_SESSION_ID").cloned().unwrap_or_default();
    assert!(!session_id.is_empty(), "{env:?}");
    assert!(header.contains(&session_id), "{header}");
    let proxy_url = env.get("HTTPS_PROXY").cloned().unwrap_or_default();
    let token = proxy_url
        .strip_prefix("http://agent:")
        .and_then(|rest| rest.strip_suffix(&format!("@{}", server.proxy_addr)))
        .unwrap_or_else(|| {
            panic!(
                "HTTPS_PROXY {proxy_url:?} is not http://agent:<token>@{}",
                server.proxy_addr
            )
        });
    assert!(token.len() > 20, "the token is in the proxy URL");
    for name in ["HTTP_PROXY", "http_proxy", "https_proxy"] {
        assert_eq!(env.get(name), Some(&proxy_url), "{name}");
    }
    let ca_pem = std::fs::read_to_string(server.state.join("ca.pem")).unwrap();
    for name in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
    ] {
        let path = env
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not exported"));
        assert!(Path::new(path).is_absolute(), "{name}={path}");
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            ca_pem,
            "{name} names the proxy CA"
        );
    }

    // curl with nothing but the exports: allowed, then a host outside the policy.
    let script = "source \"$1\" && curl -q -sS -w '\\n%{http_code}' \"$2\"";
    let allowed_url = upstream.url("/echo?from=shell");
    let ok = clients::run(
        "bash",
        &["-c", script, "_", &exports_arg, &allowed_url],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(ok.success(), "{ok}");
    let (echo, code) = body_and_code(&ok);
    assert_eq!(code, "200", "{ok}");
    assert_eq!(echo["query"], "from=shell");
    assert_eq!(echo["sni"], "api.example.test");
    assert!(
        echo["headers"].get("proxy-authorization").is_none(),
        "{echo}"
    );

    // A host that no permit names is refused at CONNECT (curl shows only "CONNECT tunnel
    // failed, response 403"); absolute-form http:// shows the JSON body of the refusal.
    let refused_connect = clients::run(
        "bash",
        &[
            "-c",
            script,
            "_",
            &exports_arg,
            &format!("https://other.example.test:{}/echo", upstream.port()),
        ],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(
        refused_connect.stderr.contains("response 403"),
        "{refused_connect}"
    );
    let denied_url = format!("http://other.example.test:{}/echo", upstream.port());
    let denied = clients::run(
        "bash",
        &["-c", script, "_", &exports_arg, &denied_url],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert!(denied.success(), "{denied}");
    let (body, code) = body_and_code(&denied);
    assert_eq!(code, "403", "{denied}");
    assert_eq!(body["error"], "denied", "{denied}");
    assert_eq!(
        body["resource"], "Ostiary::Host::\"other.example.test\"",
        "{denied}"
    );
    assert_eq!(
        body["policies"],
        serde_json::json!([]),
        "a default deny names no policy"
    );
    let denied_id = body["request_id"].as_str().unwrap_or_default().to_owned();
    assert!(!denied_id.is_empty(), "{denied}");
    assert_eq!(
        upstream.count("/echo"),
        1,
        "only the allowed request was forwarded"
    );
    assert!(upstream
        .seen()
        .iter()
        .all(|s| s.sni.as_deref() == Some("api.example.test")));

    // Both decisions, in order, from the audit chain.
    let records = audit_query(&server, &["--session", &session_id], |r| {
        of_kind(r, "http").len() >= 2
    })
    .await;
    let http = of_kind(&records, "http");
    assert_eq!(http.len(), 2, "{records:#?}");
    let connects = of_kind(&records, "connect");
    assert!(
        connects
            .iter()
            .any(|r| r["decision"] == "deny" && r["host"] == "other.example.test"),
        "the refused CONNECT is audited: {records:#?}"
    );
    assert_eq!(http[0]["decision"], "allow");
    assert_eq!(http[0]["host"], "api.example.test");
    assert_eq!(http[0]["path"], "/echo");
    assert_eq!(http[0]["status"], 200);
    assert_eq!(http[0]["agent"], "demo");
    assert_eq!(http[0]["policies"], serde_json::json!(["allow-demo-echo"]));
    assert_eq!(http[1]["decision"], "deny");
    assert_eq!(http[1]["host"], "other.example.test");
    assert_eq!(http[1]["error"], "denied");
    assert_eq!(http[1]["status"], 403);
    assert_eq!(http[1]["request_id"], denied_id.as_str());
    assert!(
        records.iter().all(|r| r["session"] == session_id.as_str()),
        "{records:#?}"
    );

    let denies = audit_query(&server, &["--decision", "deny"], |r| !r.is_empty()).await;
    assert!(
        denies.iter().all(|r| r["decision"] == "deny"),
        "{denies:#?}"
    );
    assert!(
        denies.iter().any(|r| r["request_id"] == denied_id.as_str()),
        "{denies:#?}"
    );

    // --json: the session itself.
    let out = ostiary(&[
        "--config", &config, "session", "new", "--agent", "demo", "--json",
    ])
    .await;
    assert!(out.success(), "{out}");
    let session: Value =
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(session["agent"], "demo");
    assert_eq!(session["tenant"], "default");
    let token = session["token"].as_str().unwrap_or_default();
    assert!(!token.is_empty());
    assert_ne!(session["session_id"], session_id.as_str(), "a new session");
    assert_eq!(
        session["proxy_url"],
        format!("http://agent:{token}@{}", server.proxy_addr)
    );
    assert_eq!(session["ca_pem"], ca_pem.as_str());
    assert!(session["expires_at"].as_i64().is_some_and(|t| t > 0));

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_passes_exit_code_and_revokes_the_session() {
    let upstream = Upstream::builder().start().await;
    let server = Server::start(&upstream, &["api.example.test"], POLICY).await;
    let config = server.config_arg();
    let url = upstream.url("/echo?from=run");
    let script = format!(
        "curl -q -sS -w '\\n%{{http_code}}\\n' '{url}'; echo \"PROXY=$HTTPS_PROXY\"; echo \"SID=$OSTIARY_SESSION_ID\"; exit 7"
    );
    let out = ostiary(&[
        "--config", &config, "run", "--agent", "demo", "--", "sh", "-c", &script,
    ])
    .await;
    assert_eq!(
        out.status, 7,
        "the child's exit code is passed through:\n{out}"
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let echo: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(lines[1], "200", "{out}");
    assert_eq!(echo["query"], "from=run");
    assert!(
        echo["headers"].get("proxy-authorization").is_none(),
        "{echo}"
    );
    let proxy_url = lines[2].strip_prefix("PROXY=").unwrap_or_default();
    let session_id = lines[3].strip_prefix("SID=").unwrap_or_default();
    assert!(
        proxy_url.starts_with("http://agent:")
            && proxy_url.ends_with(&format!("@{}", server.proxy_addr)),
        "{out}"
    );
    assert!(!session_id.is_empty(), "{out}");
    assert_eq!(upstream.count("/echo"), 1);

    // The session ended with the child: its token is refused, on CONNECT and on plain http.
    let https = curl_raw(&[
        "-x",
        proxy_url,
        "-w",
        "%{http_connect}",
        &upstream.url("/echo"),
    ])
    .await;
    assert!(!https.success(), "{https}");
    assert_eq!(https.stdout.trim(), "407", "{https}");
    let plain_url = format!("http://api.example.test:{}/echo", upstream.port());
    let plain = curl_raw(&["-i", "-x", proxy_url, &plain_url]).await;
    assert!(plain.success(), "{plain}");
    let (head, body) = plain
        .stdout
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("{plain}"));
    assert!(head.starts_with("HTTP/1.1 407"), "{plain}");
    let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}:\n{plain}"));
    assert_eq!(body["error"], "unauthenticated");
    assert!(
        body["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("not active"),
        "{body}"
    );
    assert_eq!(upstream.count("/echo"), 1, "nothing more was forwarded");

    let records = audit_query(&server, &["--session", session_id], |r| {
        r.iter().any(|r| r["reason"] == "session revoked")
    })
    .await;
    let lifecycle: Vec<&str> = of_kind(&records, "session")
        .iter()
        .filter_map(|r| r["reason"].as_str())
        .collect();
    assert_eq!(
        lifecycle,
        ["session created", "session revoked"],
        "{records:#?}"
    );
    let http = of_kind(&records, "http");
    assert_eq!(http.len(), 1, "{records:#?}");
    assert_eq!(http[0]["decision"], "allow");
    server.stop().await;
}

/// curl with no environment from the test beyond the scrubbed defaults.
async fn curl_raw(args: &[&str]) -> CmdOutput {
    clients::curl(args, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_export_prints_the_state_ca() {
    let upstream = Upstream::builder().start().await;
    let server = Server::start(&upstream, &["api.example.test"], POLICY).await;
    let out = ostiary(&["--config", &server.config_arg(), "ca", "export"]).await;
    assert!(out.success(), "{out}");
    let on_disk = std::fs::read_to_string(server.state.join("ca.pem")).unwrap();
    assert!(
        on_disk.starts_with("-----BEGIN CERTIFICATE-----"),
        "{on_disk}"
    );
    assert_eq!(out.stdout, on_disk);
    server.stop().await;
}

/// Copies the (flat) state directory, WAL included, to `to`.
fn copy_state(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// `ostiary audit verify` against the state directory `state`.
async fn verify(state: &Path) -> CmdOutput {
    let config = state.with_extension("toml");
    std::fs::write(&config, format!("[state]\ndir = \"{}\"\n", state.display())).unwrap();
    ostiary(&["--config", &config.display().to_string(), "audit", "verify"]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_verify_detects_edits_and_deletions() {
    let upstream = Upstream::builder().start().await;
    let server = Server::start(&upstream, &["api.example.test"], POLICY).await;
    let config = server.config_arg();
    // Some history: three sessions, and traffic in one of them.
    let mut exports = String::new();
    for _ in 0..3 {
        let out = ostiary(&["--config", &config, "session", "new", "--agent", "demo"]).await;
        assert!(out.success(), "{out}");
        exports = out.stdout;
    }
    let exports_path = server.dir.path().join("exports.sh");
    std::fs::write(&exports_path, exports).unwrap();
    let script =
        "source \"$1\" && curl -q -sS -w '%{http_code} ' -o /dev/null \"$2\" -o /dev/null \"$3\"";
    let out = clients::run(
        "bash",
        &[
            "-c",
            script,
            "_",
            &exports_path.display().to_string(),
            &upstream.url("/echo"),
            &upstream.url("/other"),
        ],
        &[],
        CLI_TIMEOUT,
    )
    .await;
    assert_eq!(out.stdout.trim(), "200 403", "{out}");
    let dir = server.stop().await;
    let state = dir.path().join("state");

    let rows: i64 = rusqlite::Connection::open(state.join("ostiary.db"))
        .and_then(|conn| conn.query_row("SELECT count(*) FROM audit", [], |r| r.get(0)))
        .unwrap();
    assert!(
        rows >= 6,
        "3 sessions, 1 connect, 2 requests: {rows} records"
    );

    let intact = dir.path().join("intact");
    copy_state(&state, &intact);
    let out = verify(&intact).await;
    assert!(out.success(), "an untouched chain verifies:\n{out}");
    assert_eq!(
        out.stdout.trim(),
        format!("ok: {rows} records, chain intact"),
        "{out}"
    );

    let middle = rows / 2;
    // (a) one record's JSON edited in place.
    let edited = dir.path().join("edited");
    copy_state(&state, &edited);
    {
        let conn = rusqlite::Connection::open(edited.join("ostiary.db")).unwrap();
        let json: String = conn
            .query_row("SELECT record FROM audit WHERE seq = ?1", [middle], |r| {
                r.get(0)
            })
            .unwrap();
        let mut record: Value = serde_json::from_str(&json).unwrap();
        record["request_id"] = Value::String("forged".into());
        let changed = conn
            .execute(
                "UPDATE audit SET record = ?1 WHERE seq = ?2",
                rusqlite::params![record.to_string(), middle],
            )
            .unwrap();
        assert_eq!(changed, 1);
    }
    let out = verify(&edited).await;
    assert_eq!(out.status, 1, "an edited record is detected:\n{out}");
    assert!(out.stdout.starts_with("FAILED"), "{out}");
    assert!(
        out.stdout
            .contains(&format!("record {middle}: content does not match its seal")),
        "{out}"
    );

    // (b) a middle record deleted.
    let gap = dir.path().join("gap");
    copy_state(&state, &gap);
    {
        let conn = rusqlite::Connection::open(gap.join("ostiary.db")).unwrap();
        assert_eq!(
            conn.execute("DELETE FROM audit WHERE seq = ?1", [middle])
                .unwrap(),
            1
        );
    }
    let out = verify(&gap).await;
    assert_eq!(out.status, 1, "a deleted middle record is detected:\n{out}");
    assert!(
        out.stdout.contains(&format!(
            "record {}: expected sequence {middle}",
            middle + 1
        )),
        "{out}"
    );

    // (c) the newest record deleted: only the head checkpoint can tell.
    let truncated = dir.path().join("truncated");
    copy_state(&state, &truncated);
    {
        let conn = rusqlite::Connection::open(truncated.join("ostiary.db")).unwrap();
        assert_eq!(
            conn.execute("DELETE FROM audit WHERE seq = ?1", [rows])
                .unwrap(),
            1
        );
    }
    let out = verify(&truncated).await;
    assert_eq!(out.status, 1, "a deleted newest record is detected:\n{out}");
    assert!(out.stdout.contains("newest records deleted"), "{out}");

    // The original is still intact: the copies were independent.
    assert!(verify(&state).await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_config_creates_state_on_default_ports() {
    let proxy: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let control: SocketAddr = ([127, 0, 0, 1], 8081).into();
    for addr in [proxy, control] {
        if let Err(e) = TcpListener::bind(addr) {
            panic!(
                "this test runs `ostiary serve` with no config, which binds the default \
                 {proxy} and {control}; {addr} is not free ({e}). Stop whatever listens there."
            );
        }
    }
    let cwd = tempfile::tempdir().unwrap();
    let log = cwd.path().join("serve.log");
    let mut child = spawn_serve(None, Some(cwd.path()), &log);
    if let Err(text) = wait_healthy(&mut child, control, &log).await {
        panic!("{text}");
    }
    let state = cwd.path().join(".ostiary");
    for name in [
        "ca.pem",
        "ca.key.pem",
        "admin.token",
        "session-signing.key.pem",
        "ostiary.db",
    ] {
        assert!(
            state.join(name).is_file(),
            "{name} was not created in .ostiary/"
        );
    }
    for secret in ["ca.key.pem", "admin.token", "session-signing.key.pem"] {
        let mode = std::fs::metadata(state.join(secret))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "{secret} must be private, is {mode:o}");
    }
    assert!(std::fs::read_to_string(state.join("ca.pem"))
        .unwrap()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(!std::fs::read_to_string(state.join("admin.token"))
        .unwrap()
        .trim()
        .is_empty());
    // The proxy listener is up too: a request without credentials is asked for them.
    let out = clients::curl(
        &[
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-x",
            "http://127.0.0.1:8080",
            "http://example.invalid/",
        ],
        &[],
    )
    .await;
    assert_eq!(out.stdout, "407", "{out}");
    terminate(&mut child, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_validate_accepts_the_library_and_names_broken_files() {
    let dir = tempfile::tempdir().unwrap();
    let write_config = |name: &str, policy_dir: &Path| {
        let path = dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "[state]\ndir = \"{}\"\n[policy]\ndir = \"{}\"\n",
                dir.path().join("state").display(),
                policy_dir.display()
            ),
        )
        .unwrap();
        path.display().to_string()
    };

    let library = workspace_root().join("policies/library");
    let config = write_config("library.toml", &library);
    let out = ostiary(&["--config", &config, "policy", "validate"]).await;
    assert!(out.success(), "{out}");
    assert!(out.stdout.starts_with("ok: "), "{out}");
    assert!(out.stdout.contains(&library.display().to_string()), "{out}");
    assert!(
        !dir.path().join("state").exists(),
        "validating creates no state"
    );

    // A syntax error.
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("fine.cedar"), POLICY).unwrap();
    std::fs::write(
        broken.join("typo.cedar"),
        "@id(\"typo\")\npermit (principal, action == Ostiary::Action::\"http\", resource)\nwhen { context.path == };\n",
    )
    .unwrap();
    let config = write_config("broken.toml", &broken);
    let out = ostiary(&["--config", &config, "policy", "validate"]).await;
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("typo.cedar:3"),
        "the message names file and line:\n{out}"
    );

    // Well-formed Cedar that fails strict validation against the schema.
    let invalid = dir.path().join("invalid");
    std::fs::create_dir_all(&invalid).unwrap();
    std::fs::write(
        invalid.join("unknown-attr.cedar"),
        "@id(\"bad-attr\")\npermit (principal, action == Ostiary::Action::\"http\", resource)\nwhen { context.no_such_field == \"x\" };\n",
    )
    .unwrap();
    let config = write_config("invalid.toml", &invalid);
    let out = ostiary(&["--config", &config, "policy", "validate"]).await;
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("unknown-attr.cedar"),
        "the message names the file:\n{out}"
    );
    assert!(out.stderr.contains("bad-attr"), "and the policy:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_explain_decides_tool_calls_from_the_catalog() {
    let library = workspace_root().join("policies/library");
    let library_arg = library.display().to_string();
    let out = ostiary(&[
        "policy",
        "explain",
        "--dir",
        &library_arg,
        "--agent",
        "a",
        "--tool",
        "github.delete_repo",
        "--args",
        r#"{"owner":"a","repo":"b"}"#,
        "--json",
    ])
    .await;
    assert!(out.success(), "{out}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON output");
    assert_eq!(json["decision"], "escalate", "{out}");
    assert!(out.stdout.contains("irreversible-needs-human"), "{out}");

    // A tool the catalog does not have is a usage error, not a decision.
    let out = ostiary(&[
        "policy",
        "explain",
        "--dir",
        &library_arg,
        "--agent",
        "a",
        "--tool",
        "no.such_tool",
    ])
    .await;
    assert!(!out.success(), "{out}");
    assert!(out.stderr.contains("not in the catalog"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_test_exit_codes_say_pass_fail_or_error() {
    let library = workspace_root().join("policies/library");
    let library_arg = library.display().to_string();
    let out = ostiary(&["policy", "test", "--dir", &library_arg]).await;
    assert!(out.success(), "{out}");
    assert!(out.stdout.contains("ok   egress.toml: "), "{out}");
    assert!(
        out.stdout.trim_end().ends_with(" passed, 0 failed"),
        "{out}"
    );

    // The library's policies with one wrong expectation added.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        library.join("egress.cedar"),
        dir.path().join("egress.cedar"),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("tests")).unwrap();
    std::fs::write(
        dir.path().join("tests/wrong.toml"),
        "[[case]]\nname = \"publishing is allowed\"\naction = \"http\"\nhost = \"pypi.org\"\nmethod = \"POST\"\nexpect = \"allow\"\n\n\
         [[case]]\nname = \"reading is allowed\"\naction = \"http\"\nhost = \"pypi.org\"\nexpect = \"allow\"\n",
    )
    .unwrap();
    let dir_arg = dir.path().display().to_string();
    let out = ostiary(&["policy", "test", "--dir", &dir_arg]).await;
    assert_eq!(out.status, 1, "{out}");
    assert!(
        out.stdout
            .contains("FAIL wrong.toml: publishing is allowed\n     expected allow, got deny"),
        "{out}"
    );
    assert!(out.stdout.contains("1 passed, 1 failed"), "{out}");

    // No tests directory: an error, not a pass.
    std::fs::remove_dir_all(dir.path().join("tests")).unwrap();
    let out = ostiary(&["policy", "test", "--dir", &dir_arg]).await;
    assert_eq!(out.status, 2, "{out}");
    assert!(out.stderr.contains("no test directory"), "{out}");

    // And explain names the determining policy and its file.
    let out = ostiary(&[
        "policy",
        "explain",
        "--dir",
        &library_arg,
        "--agent",
        "demo",
        "--host",
        "169.254.169.254",
        "--json",
    ])
    .await;
    assert!(out.success(), "{out}");
    let explanation: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(explanation["decision"], "deny", "{out}");
    assert_eq!(
        explanation["policies"][0],
        serde_json::json!({"id": "forbid-metadata-service", "file": "egress.cedar"})
    );
}
