//! Shared by the runs tests (`runs_*.rs`): a real `ostiary serve` with `[[trigger]]`s whose
//! secrets come from the file broker (credentials with no hosts: secrets only Ostiary reads),
//! a directory where unsandboxed runs leave their marks, signed deliveries (GitHub, Stripe)
//! sent by hand, the runs API with the admin token, and what `/proc` says about a run's
//! processes.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hmac::{Hmac, Mac};
use ostiary_e2e::raw::{exchange, Reply, Wire};
use ostiary_e2e::upstream::Upstream;
use serde_json::Value;
use sha2::Sha256;

use crate::support::cli::{audit_query, free_port, ostiary, Server};

/// The GitHub webhook's signing secret (credential `gh`).
pub(crate) const GH_SECRET: &str = "gh-webhook-secret-7f3a";
/// The Stripe webhook's signing secret (credential `stripe`).
pub(crate) const STRIPE_SECRET: &str = "whsec_stripe-secret-91c2";
/// An API trigger's own token (credential `api-token`).
pub(crate) const API_TOKEN: &str = "api-trigger-token-5d0e";

/// The rig's policy: the demo upstream's `/echo`, and every trigger may start its runs.
pub(crate) const RUNS_POLICY: &str = r#"
@id("allow-demo-echo")
permit (principal, action == Ostiary::Action::"http", resource == Ostiary::Host::"api.example.test")
when { context.path == "/echo" };

@id("triggers-start-runs")
permit (principal, action == Ostiary::Action::"trigger", resource);
"#;

/// How long a run may take to reach what a test waits for.
pub(crate) const RUN_DEADLINE: Duration = Duration::from_secs(30);

/// A directory of the test's where unsandboxed runs write what they saw and did.
#[derive(Debug)]
pub(crate) struct Marks {
    dir: tempfile::TempDir,
}

impl Marks {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// The directory's path as a shell would quote it (tempdir paths have no quotes).
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The file's text, or empty when it does not exist (yet).
    pub(crate) fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    pub(crate) fn lines(&self, name: &str) -> Vec<String> {
        self.read(name).lines().map(str::to_owned).collect()
    }

    /// Waits until `name` has at least `n` lines; panics naming `what` at the deadline.
    pub(crate) async fn wait_lines(&self, name: &str, n: usize, what: &str) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
        loop {
            let lines = self.lines(name);
            if lines.len() >= n {
                return lines;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: {name} has {} lines, not {n}, after {RUN_DEADLINE:?}: {lines:?}",
                lines.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A proxy with triggers, its upstream (plain HTTP, `api.example.test`, `/echo` allowed),
/// and the admin token.
pub(crate) struct RunsRig {
    pub(crate) upstream: Upstream,
    pub(crate) server: Server,
    pub(crate) admin: String,
    /// `listen.triggers`, when the rig was started with one.
    pub(crate) triggers_addr: Option<SocketAddr>,
    /// The broker's secrets file and the runs' directories.
    pub(crate) files: tempfile::TempDir,
}

/// What a rig is started with besides its triggers.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// `[runs] concurrency` (default 4).
    pub(crate) concurrency: Option<usize>,
    /// A TLS upstream (for sandboxed runs, whose clients trust the proxy's CA).
    pub(crate) tls: bool,
    /// Bind `listen.triggers` too.
    pub(crate) triggers_listener: bool,
    /// The policy file, instead of [`RUNS_POLICY`].
    pub(crate) policy: Option<String>,
}

impl RunsRig {
    /// A proxy with `triggers` (`[[trigger]]` tables) in its config.
    pub(crate) async fn start(triggers: &str) -> Self {
        Self::start_with(triggers, Options::default()).await
    }

    /// Like [`RunsRig::start`]; `@UPSTREAM@` in `triggers` is the upstream's base URL
    /// (`http://api.example.test:<port>`, or `https://` with `options.tls`).
    pub(crate) async fn start_with(triggers: &str, options: Options) -> Self {
        let upstream = Upstream::builder()
            .tls(options.tls)
            .names(&["api.example.test"])
            .start()
            .await;
        let triggers = triggers.replace("@UPSTREAM@", &upstream.url(""));
        let files = tempfile::tempdir().unwrap();
        let secrets = files.path().join("secrets.toml");
        std::fs::write(
            &secrets,
            format!(
                "gh = \"{GH_SECRET}\"\nstripe = \"{STRIPE_SECRET}\"\napi-token = \"{API_TOKEN}\"\n"
            ),
        )
        .unwrap();
        let extra = format!(
            r#"
[broker]
backend = "file"
file = "{secrets}"

[[credential]]
name = "gh"
source = {{ file = "gh" }}

[[credential]]
name = "stripe"
source = {{ file = "stripe" }}

[[credential]]
name = "api-token"
source = {{ file = "api-token" }}

[runs]
dir = "{runs}"
concurrency = {concurrency}
stop_grace = "1s"

{triggers}
"#,
            secrets = secrets.display(),
            runs = files.path().join("runs").display(),
            concurrency = options.concurrency.unwrap_or(4),
        );
        let triggers_addr: Option<SocketAddr> = options
            .triggers_listener
            .then(|| ([127, 0, 0, 1], free_port()).into());
        let listen = triggers_addr
            .map(|a| format!("triggers = \"{a}\""))
            .unwrap_or_default();
        let server = Server::start_with_listen(
            &upstream,
            &["api.example.test"],
            options.policy.as_deref().unwrap_or(RUNS_POLICY),
            &[],
            &listen,
            &extra,
            "info",
        )
        .await;
        let admin = std::fs::read_to_string(server.state.join("admin.token"))
            .unwrap()
            .trim()
            .to_owned();
        Self {
            upstream,
            server,
            admin,
            triggers_addr,
            files,
        }
    }

    pub(crate) fn control(&self) -> SocketAddr {
        self.server.control_addr
    }

    /// A request to the control API with `token` (none: unauthenticated).
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> Reply {
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let body = body.map(Value::to_string).unwrap_or_default();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n{body}",
            host = self.control(),
            len = body.len(),
        );
        exchange(self.control(), request.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// `POST /v1/runs` with the admin token.
    pub(crate) async fn start_run(&self, trigger: &str, payload: Value) -> String {
        let body = serde_json::json!({"trigger": trigger, "payload": payload});
        let reply = self
            .call("POST", "/v1/runs", Some(&self.admin), Some(&body))
            .await;
        assert_eq!(reply.status.as_u16(), 202, "{reply}");
        reply.json()["run_id"].as_str().unwrap().to_owned()
    }

    /// `GET /v1/runs/{id}`.
    pub(crate) async fn run(&self, id: &str) -> Value {
        let reply = self
            .call("GET", &format!("/v1/runs/{id}"), Some(&self.admin), None)
            .await;
        assert_eq!(reply.status.as_u16(), 200, "{reply}");
        reply.json()
    }

    /// `GET /v1/runs?<query>`.
    pub(crate) async fn runs(&self, query: &str) -> Vec<Value> {
        let reply = self
            .call("GET", &format!("/v1/runs?{query}"), Some(&self.admin), None)
            .await;
        assert_eq!(reply.status.as_u16(), 200, "{reply}");
        reply.json()["runs"].as_array().unwrap().clone()
    }

    /// Run `id` once `ready` holds for it; panics with the run at the deadline.
    pub(crate) async fn wait_run(
        &self,
        id: &str,
        what: &str,
        ready: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + RUN_DEADLINE;
        loop {
            let run = self.run(id).await;
            if ready(&run) {
                return run;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {RUN_DEADLINE:?}; the run: {run:#}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Run `id` once it is in `status`.
    pub(crate) async fn wait_status(&self, id: &str, status: &str) -> Value {
        self.wait_run(id, &format!("run {id} {status}"), |r| r["status"] == status)
            .await
    }

    /// `ostiary --config <config> <args>` with `--json`, parsed (asserting success).
    pub(crate) async fn cli_json(&self, args: &[&str]) -> Value {
        let config = self.server.config_arg();
        let mut all = vec!["--config", config.as_str(), "--json"];
        all.extend_from_slice(args);
        let out = ostiary(&all).await;
        assert!(out.success(), "ostiary {args:?}: {out}");
        serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("ostiary {args:?} --json is not JSON ({e}): {out}"))
    }

    /// The server's log so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.server.log).unwrap_or_default()
    }

    /// Audit records of kind `trigger`, once `ready` holds for them.
    pub(crate) async fn trigger_records(&self, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let records = audit_query(&self.server, &[], |all| ready(&of_kind(all, "trigger"))).await;
        of_kind(&records, "trigger")
    }

    /// Audit records of kind `run`, once `ready` holds for them.
    pub(crate) async fn run_records(&self, ready: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let records = audit_query(&self.server, &[], |all| ready(&of_kind(all, "run"))).await;
        of_kind(&records, "run")
    }
}

fn of_kind(records: &[Value], kind: &str) -> Vec<Value> {
    records
        .iter()
        .filter(|r| r["kind"] == kind)
        .cloned()
        .collect()
}

/// A webhook delivery: `POST /v1/triggers/{trigger}` on `addr` with `headers` and `body`
/// (its `Content-Length` honest).
pub(crate) async fn deliver(
    addr: SocketAddr,
    trigger: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Reply {
    let mut head = format!(
        "POST /v1/triggers/{trigger} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    exchange(addr, &request)
        .await
        .unwrap_or_else(|e| panic!("delivering to {trigger}: {e}"))
}

/// A delivery with `Transfer-Encoding: chunked` and no length, in chunks of 1 KiB.
pub(crate) async fn deliver_chunked(
    addr: SocketAddr,
    trigger: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Reply {
    let mut head = format!(
        "POST /v1/triggers/{trigger} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    for chunk in body.chunks(1024) {
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(chunk);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let mut wire = Wire::new(tokio::net::TcpStream::connect(addr).await.unwrap());
    // The proxy may answer (and close) before it has read everything: a write it refused
    // is not the test's concern, its answer is.
    let _ = wire.send(&request).await;
    wire.response()
        .await
        .unwrap_or_else(|e| panic!("delivering (chunked) to {trigger}: {e}"))
}

fn hmac_hex(secret: &str, parts: &[&[u8]]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    for part in parts {
        mac.update(part);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// GitHub's headers for `body`: `X-Hub-Signature-256` and `X-GitHub-Delivery: delivery`.
pub(crate) fn github_headers(body: &[u8], delivery: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "X-Hub-Signature-256",
            format!("sha256={}", hmac_hex(GH_SECRET, &[body])),
        ),
        ("X-GitHub-Delivery", delivery.to_owned()),
        ("X-GitHub-Event", "push".to_owned()),
    ]
}

/// `Stripe-Signature: t=<unix>,v1=<hex>` for `body` signed at `t`.
pub(crate) fn stripe_header(body: &[u8], t: i64) -> (&'static str, String) {
    let ts = t.to_string();
    (
        "Stripe-Signature",
        format!(
            "t={ts},v1={}",
            hmac_hex(STRIPE_SECRET, &[ts.as_bytes(), b".", body])
        ),
    )
}

pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A word no other test's process carries in its command line: this test process's id.
pub(crate) fn unique_token() -> String {
    format!("{}{}", std::process::id(), now_ms() % 100_000)
}

/// The live processes (not zombies) whose command line holds `token`, as `(pid, command
/// line)`.
pub(crate) fn processes_with(token: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if line.contains(token) && !zombie(pid) {
            found.push((pid, line.trim().to_owned()));
        }
    }
    found
}

/// Whether process `pid` is alive (exists and is not a zombie).
pub(crate) fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists() && !zombie(pid)
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Waits up to `within` for no live process to carry `token`; the ones left otherwise.
pub(crate) async fn gone_within(token: &str, within: Duration) -> Vec<(i32, String)> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = processes_with(token);
        if left.is_empty() || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills the processes this test started that are still alive (by pid, each checked to
/// carry `token`), so a failed test leaves nothing behind.
pub(crate) fn kill_leftovers(token: &str) {
    for (pid, _) in processes_with(token) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
}
