//! The fleet harness of `fleet.rs` and `fleet_faults.rs`: several `ostiary serve` replicas
//! on one PostgreSQL schema, one Redis prefix and one set of keys (`state.keys_dir`, made by
//! `ostiary state init`), with an agent client per replica and the control API's helpers.
//! Each test crate uses a subset, so unused items are allowed here.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::postgres::Schema;
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{ControlClient, NewSession, SdkError, Session};
use serde_json::Value;
use tokio::process::{Child, Command};

use crate::support::cli;

pub(crate) const TOOLS: &str = r#"
[[tool]]
name = "pay.lookup"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/echo" }

[[tool]]
name = "pay.status"
tier = "write"
match = { host = "api.example.test", method = "GET", path = "/status/{code}" }

[[tool]]
name = "pay.note"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/idem/notes/{n}" }

[[tool]]
name = "pay.refund"
tier = "irreversible"
match = { host = "api.example.test", method = "POST", path = "/idem/refunds/{charge}" }
"#;

pub(crate) const POLICIES: &str = r#"
@id("reads-and-writes")
permit (principal, action in [Ostiary::Action::"tier:read", Ostiary::Action::"tier:write"], resource);

@id("irreversible-permit")
permit (principal, action in Ostiary::Action::"tier:irreversible", resource);

@id("irreversible-needs-human")
@escalate("approval")
forbid (principal, action in Ostiary::Action::"tier:irreversible", resource)
unless { context.approval.granted };

@id("triggers-start-runs")
permit (principal, action == Ostiary::Action::"trigger", resource);
"#;

/// What every fleet here configures: fast sweeps and reaping, a short claim lease, a
/// drain that does not hold a test up.
pub(crate) const BASE_TOML: &str = r#"
[approvals]
approvers = ["alice@example.com"]
tick = "200ms"
claim_lease = "2s"

[broker]
reap_interval = "1s"
"#;

/// Most fleets here repeat one call on purpose: the loop watchdog is the watchdog test's.
pub(crate) const NO_WATCHDOG: &str = "[sessions.watchdog]\nenabled = false\n";

pub(crate) const APPROVER: &str = "alice@example.com";

pub(crate) fn redis_url() -> String {
    std::env::var("OSTIARY_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub(crate) fn unique(what: &str) -> String {
    format!(
        "{what}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// One `ostiary serve` of a fleet.
pub(crate) struct Replica {
    pub(crate) name: String,
    pub(crate) child: Child,
    pub(crate) proxy_addr: SocketAddr,
    pub(crate) control_addr: SocketAddr,
    pub(crate) log: PathBuf,
}

/// What the replicas of a fleet share, and the replicas.
pub(crate) struct Fleet {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) keys: PathBuf,
    pub(crate) policies: PathBuf,
    pub(crate) ca_file: PathBuf,
    pub(crate) store: String,
    pub(crate) redis: String,
    pub(crate) prefix: String,
    pub(crate) token: String,
    pub(crate) upstream_port: u16,
    pub(crate) extra: String,
    pub(crate) replicas: Vec<Replica>,
    pub(crate) _schema: Schema,
}

impl Fleet {
    /// `n` replicas on a fresh schema and prefix; `store`/`redis` override where they dial
    /// (a relay in front of PostgreSQL, a Redis of the test's own).
    pub(crate) async fn start(
        upstream: &Upstream,
        n: usize,
        extra: &str,
        store: Option<&dyn Fn(&Schema) -> String>,
        redis: Option<String>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        // The operator's step: the shared keys, made once.
        let made = cli::ostiary(&["state", "init", "--dir", &keys.display().to_string()]).await;
        assert!(made.success(), "{made}");
        let policies = dir.path().join("policies");
        std::fs::create_dir_all(&policies).unwrap();
        std::fs::write(policies.join("test.cedar"), POLICIES).unwrap();
        std::fs::write(policies.join("tools.toml"), TOOLS).unwrap();
        let ca_file = upstream.write_ca(dir.path());
        let schema = Schema::create();
        let mut fleet = Self {
            store: store.map_or_else(|| schema.url(), |f| f(&schema)),
            redis: redis.unwrap_or_else(redis_url),
            prefix: unique("fleet"),
            token: ostiary::state::random_hex(32),
            upstream_port: upstream.port(),
            extra: if extra.contains("[sessions.watchdog]") {
                format!("{BASE_TOML}\n{extra}")
            } else {
                format!("{BASE_TOML}\n{NO_WATCHDOG}\n{extra}")
            },
            replicas: Vec::new(),
            dir,
            keys,
            policies,
            ca_file,
            _schema: schema,
        };
        for i in 0..n {
            let replica = fleet.start_replica(i).await;
            fleet.replicas.push(replica);
        }
        fleet
    }

    /// Start replica `i` (free ports; retried if another process takes one meanwhile).
    pub(crate) async fn start_replica(&self, i: usize) -> Replica {
        let name = format!("r{i}");
        let home = self.dir.path().join(&name);
        std::fs::create_dir_all(&home).unwrap();
        let mut last = String::new();
        for attempt in 0..3 {
            let proxy_addr: SocketAddr = ([127, 0, 0, 1], cli::free_port()).into();
            let control_addr: SocketAddr = ([127, 0, 0, 1], cli::free_port()).into();
            let config = home.join("ostiary.toml");
            std::fs::write(&config, self.config_text(&home, proxy_addr, control_addr)).unwrap();
            let log = home.join(format!("serve-{attempt}.log"));
            let mut child = self.spawn(&config, &log, &name);
            match cli::wait_healthy(&mut child, control_addr, &log).await {
                Ok(()) => {
                    return Replica {
                        name,
                        child,
                        proxy_addr,
                        control_addr,
                        log,
                    }
                }
                Err(text) => {
                    let _ = child.kill().await;
                    if !text.contains("binding") {
                        panic!("replica {name} did not start:\n{text}");
                    }
                    last = text;
                }
            }
        }
        panic!("replica {name} did not start:\n{last}");
    }

    pub(crate) fn config_text(
        &self,
        home: &Path,
        proxy: SocketAddr,
        control: SocketAddr,
    ) -> String {
        format!(
            r#"
[listen]
proxy = "{proxy}"
control = "{control}"
drain = "1s"

[state]
dir = "{state}"
store = "{store}"
redis = "{redis}"
redis_prefix = "{prefix}"
keys_dir = "{keys}"

[policy]
dir = "{policies}"

[egress]
ports = [80, 443, {port}]
allow_private = ["127.0.0.1/32"]
resolve = {{ "api.example.test" = "127.0.0.1" }}
ca_file = "{ca}"
{extra}
"#,
            state = home.join("state").display(),
            store = self.store,
            redis = self.redis,
            prefix = self.prefix,
            keys = self.keys.display(),
            policies = self.policies.display(),
            port = self.upstream_port,
            ca = self.ca_file.display(),
            extra = self.extra,
        )
    }

    /// `ostiary serve` with the fleet's admin token and this replica's name.
    pub(crate) fn spawn(&self, config: &Path, log: &Path, name: &str) -> Child {
        let out = std::fs::File::create(log).unwrap();
        let mut cmd = Command::new(cli::ostiary_bin());
        cmd.arg("--config")
            .arg(config)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .env("OSTIARY_LOG", "info")
            .env("OSTIARY_ADMIN_TOKEN", &self.token)
            .env("OSTIARY_REPLICA_ID", name)
            .kill_on_drop(true);
        for var in [
            "OSTIARY_CONFIG",
            "OSTIARY_LOG_FORMAT",
            "OSTIARY_STATE_STORE",
            "OSTIARY_STATE_REDIS",
        ] {
            cmd.env_remove(var);
        }
        for var in ostiary_e2e::clients::SCRUBBED_ENV {
            cmd.env_remove(var);
        }
        cmd.spawn().expect("starting ostiary serve")
    }

    pub(crate) fn control(&self, i: usize) -> ControlClient {
        ControlClient::new(
            format!("http://{}", self.replicas[i].control_addr),
            &self.token,
        )
    }

    /// An agent's HTTPS client through replica `i` with `session`'s token.
    pub(crate) fn agent(&self, i: usize, session: &Session) -> reqwest::Client {
        let ca = std::fs::read(self.keys.join("ca.pem")).unwrap();
        reqwest::Client::builder()
            .proxy(
                reqwest::Proxy::all(format!(
                    "http://agent:{}@{}",
                    session.token, self.replicas[i].proxy_addr
                ))
                .unwrap(),
            )
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    }

    /// Status and JSON body of `agent`'s GET of `path` through replica `i`, a refused
    /// CONNECT included. reqwest reports a refused CONNECT without its answer, and it may
    /// open a new tunnel for any request (a connection is back in its pool a moment after
    /// the previous answer was read), so the refusal is read from a raw CONNECT with
    /// `session`'s token, made at once.
    pub(crate) async fn get_as(
        &self,
        i: usize,
        session: &Session,
        agent: &reqwest::Client,
        path: &str,
    ) -> (u16, Value) {
        match agent.get(self.url(path)).send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let text = response.text().await.unwrap();
                (
                    status,
                    serde_json::from_str(&text).unwrap_or(Value::String(text)),
                )
            }
            Err(e) if format!("{e:?}").contains("TunnelUnsuccessful") => {
                let (_, reply) = ostiary_e2e::raw::connect(
                    self.replicas[i].proxy_addr,
                    &format!("api.example.test:{}", self.upstream_port),
                    &ostiary_e2e::raw::auth_line(&session.token),
                )
                .await;
                assert_ne!(reply.status, 200, "CONNECT refused, then accepted: {reply}");
                (
                    reply.status.as_u16(),
                    serde_json::from_slice(&reply.body).unwrap_or(Value::Null),
                )
            }
            Err(e) => panic!("the proxy answers: {e:?}"),
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("https://api.example.test:{}{path}", self.upstream_port)
    }

    /// A root session of `agent`, with no limits, made through replica `i`.
    pub(crate) async fn root(&self, i: usize, agent: &str) -> Session {
        self.session(
            i,
            NewSession {
                agent: agent.into(),
                ..Default::default()
            },
        )
        .await
    }

    pub(crate) async fn session(&self, i: usize, new: NewSession) -> Session {
        self.control(i)
            .create_session(&new)
            .await
            .expect("creating a session")
    }

    /// `GET /readyz` of replica `i`: status and body.
    pub(crate) async fn ready(&self, i: usize) -> (u16, Value) {
        control_get(self.replicas[i].control_addr, "/readyz", None).await
    }

    pub(crate) fn log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.replicas[i].log).unwrap_or_default()
    }
}

impl Drop for Fleet {
    /// A failing test shows what the replicas said.
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (i, replica) in self.replicas.iter().enumerate() {
                let log = self.log(i);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- {} (last lines, newest first):", replica.name);
                for line in tail {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// `GET path` on a control listener, with the admin token if given.
pub(crate) async fn control_get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .timeout(Duration::from_secs(10));
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let response = req.send().await.expect("the control listener answers");
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Status and JSON body of an agent's GET.
pub(crate) async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = match client.get(url).send().await {
        Ok(response) => response,
        // Refused at CONNECT: reqwest says so as an error, not a response.
        Err(e) if format!("{e:?}").contains("ProxyAuthRequired") => return (407, Value::Null),
        Err(e) => panic!("the proxy answers: {e:?}"),
    };
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub(crate) fn api_status(e: &SdkError) -> u16 {
    match e {
        SdkError::Api { status, .. } => *status,
        other => panic!("not an API refusal: {other}"),
    }
}

/// Poll replica `i`'s `/readyz` until its `ok` is `want`; the body.
pub(crate) async fn wait_ready(fleet: &Fleet, i: usize, want: bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = fleet.ready(i).await;
        if (status == 200) == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "readyz never became {want}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The approval id of a held refund of `charge` (`delay_ms`: the upstream answers that late).
pub(crate) async fn hold(
    fleet: &Fleet,
    agent: &reqwest::Client,
    charge: &str,
    delay_ms: u64,
) -> String {
    let url = fleet.url(&format!("/idem/refunds/{charge}?delay_ms={delay_ms}"));
    let response = agent
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"amount": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 202);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "approval_pending", "{body}");
    body["approval_id"].as_str().unwrap().to_owned()
}

/// Approve `id` on `through`'s page with a link replica `from` signed.
pub(crate) async fn approve_on_page(fleet: &Fleet, id: &str, from: usize, through: usize) {
    let link = fleet
        .control(from)
        .approval_link(id, APPROVER)
        .await
        .unwrap();
    let path = link
        .split_once("/approve/")
        .map(|(_, rest)| rest)
        .expect("a review link");
    let page = format!(
        "http://{}/approve/{path}",
        fleet.replicas[through].control_addr
    );
    let response = reqwest::Client::new()
        .post(&page)
        .header("content-type", "application/x-www-form-urlencoded")
        .body("decision=approve&reason=checked")
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
}

/// Poll any of `replicas` until approval `id` reaches `status`.
pub(crate) async fn wait_status(
    fleet: &Fleet,
    replicas: &[usize],
    id: &str,
    status: &str,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        for &i in replicas {
            if let Ok(approval) = fleet.control(i).approval(id).await {
                if approval["status"] == status {
                    return approval;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "approval {id} never became {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The replica whose log says it claimed `id` most recently, by index.
pub(crate) fn claimer(fleet: &Fleet, id: &str) -> Option<usize> {
    (0..fleet.replicas.len()).find(|&i| {
        fleet
            .log(i)
            .lines()
            .any(|l| l.contains("approval claimed for execution") && l.contains(id))
    })
}
