//! An Ostiary proxy started in-process for one test: its own state directory, a policy
//! directory holding the test's Cedar text, listeners on `127.0.0.1:0`, and a shutdown on
//! drop. Egress is confined to loopback by config (`allow_private = 127.0.0.1/32`) and,
//! where a test names other addresses, by the stub resolver and recording dialer below.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ostiary::audit::AuditRecord;
use ostiary::egress::{BoxFuture, Dial, Resolve};
use ostiary::plane::ControlPlane;
use ostiary::{Config, Options, Ostiary};
use ostiary_sdk::{ControlClient, NewSession, Session};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// A policy that permits every inspected request, every MCP message and every tunnel (for
/// tests about plumbing rather than policy).
pub const ALLOW_ALL: &str = r#"
@id("allow-all-http")
permit (principal, action == Ostiary::Action::"http", resource);
@id("allow-all-connect")
permit (principal, action == Ostiary::Action::"connect", resource);
@id("allow-all-mcp")
permit (principal, action == Ostiary::Action::"mcp", resource);
"#;

/// How to start a test proxy.
#[derive(Debug, Clone)]
pub struct ProxySpec {
    /// Cedar policy text, written to `policies/test.cedar`.
    pub policies: String,
    /// A tool catalog, written to `policies/tools.toml` when given.
    pub tools_toml: Option<String>,
    /// Host names mapped to 127.0.0.1 (`egress.resolve`).
    pub names: Vec<String>,
    /// Extra ports CONNECT may reach besides 80 and 443 (test upstreams' random ports).
    pub ports: Vec<u16>,
    /// PEM of a CA the proxy trusts for upstreams (`egress.ca_file`).
    pub upstream_ca_pem: Option<String>,
    /// Extra TOML appended to the generated config (sections not generated here).
    pub extra_toml: String,
    /// Override `egress.allow_private` (default `["127.0.0.1/32"]`).
    pub allow_private: Option<Vec<String>>,
    /// `egress.tunnel`.
    pub tunnel: Vec<String>,
    /// `policy.watch_interval` (e.g. `"100ms"`); the config default when `None`.
    pub watch_interval: Option<String>,
    /// Resolver and dialer seams.
    pub options: Options,
    /// The state directory (default: `state` in the proxy's own temporary directory), for
    /// tests that put it on a filesystem of their own or reuse it across proxies.
    pub state_dir: Option<PathBuf>,
    /// `state.store` (default `sqlite`): a `postgres://` URL puts the durable state there.
    pub store: Option<String>,
    /// `listen.proxy_unix` (default: in the state directory), for a second proxy on a
    /// shared state directory.
    pub proxy_unix: Option<PathBuf>,
    /// `state.redis` (counters shared by replicas) and its `redis_prefix`.
    pub redis: Option<(String, String)>,
    /// `state.keys_dir`: keys shared by replicas, made with `StateDir::init_keys`.
    pub keys_dir: Option<PathBuf>,
    /// `listen.proxy_threads` (default: one per core).
    pub proxy_threads: Option<usize>,
    /// `listen.drain` (e.g. `"30s"`; default 5 s).
    pub drain: Option<String>,
}

impl Default for ProxySpec {
    fn default() -> Self {
        Self {
            policies: ALLOW_ALL.to_owned(),
            tools_toml: None,
            names: vec!["api.example.test".into()],
            ports: Vec::new(),
            upstream_ca_pem: None,
            extra_toml: String::new(),
            allow_private: None,
            tunnel: Vec::new(),
            watch_interval: None,
            options: Options::default(),
            state_dir: None,
            store: None,
            proxy_unix: None,
            redis: None,
            keys_dir: None,
            proxy_threads: None,
            drain: None,
        }
    }
}

/// A running proxy.
#[derive(Debug)]
pub struct TestProxy {
    pub proxy_addr: SocketAddr,
    pub control_addr: SocketAddr,
    pub admin_token: String,
    pub dir: tempfile::TempDir,
    pub ca_pem: String,
    /// The proxy's CA written to a file, for client CA bundles.
    pub ca_path: PathBuf,
    pub config_path: PathBuf,
    pub shared: Arc<ControlPlane>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

fn toml_list<T: std::fmt::Display>(items: &[T], quote: bool) -> String {
    let parts: Vec<String> = items
        .iter()
        .map(|i| {
            if quote {
                format!("\"{i}\"")
            } else {
                i.to_string()
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

impl TestProxy {
    /// Start a proxy as described by `spec`.
    pub async fn start(spec: ProxySpec) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy_dir = dir.path().join("policies");
        std::fs::create_dir_all(&policy_dir).unwrap();
        std::fs::write(policy_dir.join("test.cedar"), &spec.policies).unwrap();
        if let Some(tools) = &spec.tools_toml {
            std::fs::write(policy_dir.join("tools.toml"), tools).unwrap();
        }
        let ca_file = match &spec.upstream_ca_pem {
            Some(pem) => {
                let p = dir.path().join("upstream-ca.pem");
                std::fs::write(&p, pem).unwrap();
                p.display().to_string()
            }
            None => String::new(),
        };
        let mut ports = vec![80u16, 443];
        ports.extend(&spec.ports);
        let resolve: BTreeMap<&str, &str> = spec
            .names
            .iter()
            .map(|n| (n.as_str(), "127.0.0.1"))
            .collect();
        let resolve = resolve
            .iter()
            .map(|(k, v)| format!("\"{k}\" = \"{v}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let allow_private = spec
            .allow_private
            .clone()
            .unwrap_or_else(|| vec!["127.0.0.1/32".into()]);
        let text = format!(
            r#"
[listen]
proxy = "127.0.0.1:0"
control = "127.0.0.1:0"
{proxy_unix}
{proxy_threads}
{drain}

[state]
dir = "{state}"
store = "{store}"
{shared}

[policy]
dir = "{policy}"
{watch}

[egress]
ports = {ports}
allow_private = {allow}
resolve = {{ {resolve} }}
ca_file = "{ca_file}"
tunnel = {tunnel}

{extra}
"#,
            state = spec
                .state_dir
                .clone()
                .unwrap_or_else(|| dir.path().join("state"))
                .display(),
            store = spec.store.as_deref().unwrap_or("sqlite"),
            shared = [
                spec.redis
                    .as_ref()
                    .map(|(url, prefix)| format!("redis = \"{url}\"\nredis_prefix = \"{prefix}\"")),
                spec.keys_dir
                    .as_ref()
                    .map(|dir| format!("keys_dir = \"{}\"", dir.display())),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("\n"),
            proxy_unix = spec
                .proxy_unix
                .as_ref()
                .map(|p| format!("proxy_unix = \"{}\"", p.display()))
                .unwrap_or_default(),
            proxy_threads = spec
                .proxy_threads
                .map(|n| format!("proxy_threads = {n}"))
                .unwrap_or_default(),
            drain = spec
                .drain
                .as_ref()
                .map(|d| format!("drain = \"{d}\""))
                .unwrap_or_default(),
            policy = policy_dir.display(),
            ports = toml_list(&ports, false),
            allow = toml_list(&allow_private, true),
            tunnel = toml_list(&spec.tunnel, true),
            watch = spec
                .watch_interval
                .as_ref()
                .map(|w| format!("watch_interval = \"{w}\""))
                .unwrap_or_default(),
            extra = spec.extra_toml,
        );
        let config_path = dir.path().join("ostiary.toml");
        std::fs::write(&config_path, &text).unwrap();
        let config = Config::load(&config_path).expect("test config loads");
        Self::start_with(config, config_path, dir, spec.options).await
    }

    async fn start_with(
        config: Config,
        config_path: PathBuf,
        dir: tempfile::TempDir,
        options: Options,
    ) -> Self {
        let ostiary = Ostiary::build(config, options).await.expect("proxy builds");
        let shared = ostiary.control_plane().clone();
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let control = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = proxy.local_addr().unwrap();
        let control_addr = control.local_addr().unwrap();
        // The Unix socket sandboxes reach the proxy through, in the state directory.
        let unix = ostiary::server::bind_unix(&shared.config.proxy_unix_path())
            .await
            .expect("binding the proxy's unix socket");
        let ostiary = ostiary.with_unix(unix);
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            ostiary
                .serve(proxy, control, async move {
                    let _ = rx.await;
                })
                .await
                .expect("proxy serves");
        });
        let ca_pem = shared.ca_pem.clone();
        let ca_path = dir.path().join("ostiary-ca.pem");
        std::fs::write(&ca_path, &ca_pem).unwrap();
        Self {
            proxy_addr,
            control_addr,
            admin_token: shared.admin_token.expose().to_owned(),
            dir,
            ca_pem,
            ca_path,
            config_path,
            shared,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// A control API client with the admin token.
    pub fn control(&self) -> ControlClient {
        ControlClient::new(format!("http://{}", self.control_addr), &self.admin_token)
    }

    /// The control API's `/metrics` text (with the admin token).
    pub async fn metrics(&self) -> String {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("a client")
            .get(format!("http://{}/metrics", self.control_addr))
            .bearer_auth(&self.admin_token)
            .send()
            .await
            .expect("/metrics answers")
            .text()
            .await
            .expect("/metrics text")
    }

    /// Create a session for `agent` in the default tenant.
    pub async fn session(&self, agent: &str) -> Session {
        self.control()
            .create_session(&NewSession {
                agent: agent.into(),
                ..Default::default()
            })
            .await
            .expect("session created")
    }

    /// `http://agent:<token>@127.0.0.1:<port>` for a session.
    pub fn proxy_url(&self, session: &Session) -> String {
        format!("http://agent:{}@{}", session.token, self.proxy_addr)
    }

    /// Every audit record so far (after flushing the writer).
    pub async fn audit(&self) -> Vec<AuditRecord> {
        self.shared.audit.flush().await;
        // On the blocking pool, as the proxy reads it (a PostgreSQL store's calls block).
        let trail = self.shared.trail.clone();
        tokio::task::spawn_blocking(move || {
            ostiary::audit::verify::query(&*trail, &Default::default()).unwrap()
        })
        .await
        .unwrap()
    }

    /// The audit record of the request whose response carried `request_id` (its own, not
    /// the `mcp_call` records of the JSON-RPC calls it carried).
    pub async fn audit_of(&self, request_id: &str) -> AuditRecord {
        self.audit()
            .await
            .into_iter()
            .find(|r| r.request_id == request_id && r.kind != "mcp_call")
            .unwrap_or_else(|| panic!("no audit record for request {request_id}"))
    }

    /// Environment for a client process: proxy variables and CA bundles.
    pub fn client_env(&self, session: &Session) -> Vec<(String, String)> {
        session.env(&self.ca_path)
    }

    /// Stop the proxy and start a new one on the same config and state directory (new
    /// ports, default resolver and dialer), as a restart of the process would.
    pub async fn restart(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let config = Config::load(&self.config_path).expect("test config reloads");
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("a temp dir"));
        *self = Self::start_with(config, self.config_path.clone(), dir, Options::default()).await;
    }

    /// Stop the proxy and wait for it.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A resolver that answers from a script: each lookup of a name takes the next answer, and
/// every lookup is counted. Names without a script fail to resolve.
#[derive(Debug, Default, Clone)]
pub struct StubResolver {
    answers: Arc<Mutex<BTreeMap<String, Vec<Vec<IpAddr>>>>>,
    lookups: Arc<Mutex<Vec<String>>>,
}

impl StubResolver {
    /// Script the answers for `name`, in order; the last one repeats.
    pub fn answer(&self, name: &str, answers: Vec<Vec<IpAddr>>) {
        self.answers
            .lock()
            .unwrap()
            .insert(name.to_owned(), answers);
    }

    /// Names looked up so far, in order.
    pub fn lookups(&self) -> Vec<String> {
        self.lookups.lock().unwrap().clone()
    }
}

impl Resolve for StubResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            self.lookups.lock().unwrap().push(host.to_owned());
            let mut answers = self.answers.lock().unwrap();
            let list = answers
                .get_mut(host)
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such test name"))?;
            if list.len() > 1 {
                Ok(list.remove(0))
            } else {
                list.first()
                    .cloned()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no answer"))
            }
        })
    }
}

/// A dialer that records every address it is asked for and connects only to loopback:
/// even a bug in the guard cannot send a packet off the machine.
#[derive(Debug, Default, Clone)]
pub struct RecordingDialer {
    dials: Arc<Mutex<Vec<SocketAddr>>>,
}

impl RecordingDialer {
    /// Addresses dialed so far.
    pub fn dials(&self) -> Vec<SocketAddr> {
        self.dials.lock().unwrap().clone()
    }
}

impl Dial for RecordingDialer {
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
        self.dials.lock().unwrap().push(addr);
        Box::pin(async move {
            if !addr.ip().is_loopback() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("test dialer refuses non-loopback {addr}"),
                ));
            }
            TcpStream::connect(addr).await
        })
    }
}
