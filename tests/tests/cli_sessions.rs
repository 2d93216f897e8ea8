//! `ostiary audit cost` and `ostiary session(s) show|resume|terminate|dead-letters` against
//! the real `ostiary serve` binary, the admin token read from the state directory via
//! `--config` (docs/design.md §6, §7).
//!
//! - `audit cost` adds up the catalog `cost` of the allowed tool calls that agents made
//!   through the proxy, by tool (default), by agent, for one `--session`, and as JSON lines;
//!   a refused call costs nothing.
//! - `sessions show ID` shows the session live with its agent; `--json` parses.
//! - `sessions terminate ID` ends it: its token then gets 407 through the proxy; ending an
//!   unknown session exits 1 and says so.
//! - `sessions resume ID` of a live session exits 1 with the server's conflict message.
//! - `sessions dead-letters` on a fresh proxy lists none.

use crate::support::cli;
use cli::*;

use std::time::Duration;

use ostiary_e2e::clients::CmdOutput;
use ostiary_e2e::upstream::Upstream;
use ostiary_sdk::{ControlClient, NewSession, Session};
use serde_json::Value;

/// `GET /echo` costs 0.25 and `POST /echo` 0.1 (reads and writes are allowed);
/// `DELETE /echo` is irreversible, which no policy permits.
const TOOLS: &str = r#"
[[tool]]
name = "demo.read"
tier = "read"
match = { host = "api.example.test", method = "GET", path = "/echo" }
cost = 0.25

[[tool]]
name = "demo.write"
tier = "write"
match = { host = "api.example.test", method = "POST", path = "/echo" }
cost = 0.1

[[tool]]
name = "demo.delete"
tier = "irreversible"
match = { host = "api.example.test", method = "DELETE", path = "/echo" }
cost = 5.0
"#;

const POLICIES: &str = r#"
@id("read-ok")
permit (principal, action in Ostiary::Action::"tier:read", resource);

@id("write-ok")
permit (principal, action in Ostiary::Action::"tier:write", resource);
"#;

struct Fixture {
    upstream: Upstream,
    server: Server,
    control: ControlClient,
    config: String,
}

/// One agent session and an HTTP client that sends everything through the proxy with it.
struct Agent {
    session: Session,
    http: reqwest::Client,
}

impl Fixture {
    async fn start() -> Self {
        let upstream = Upstream::builder().start().await;
        let server = Server::start_with_files(
            &upstream,
            &["api.example.test"],
            POLICIES,
            &[("tools.toml", TOOLS)],
            "",
            "info",
        )
        .await;
        let token = std::fs::read_to_string(server.state.join("admin.token")).unwrap();
        let control = ControlClient::new(format!("http://{}", server.control_addr), token.trim());
        let config = server.config_arg();
        Self {
            upstream,
            server,
            control,
            config,
        }
    }

    async fn agent(&self, name: &str) -> Agent {
        let session = self
            .control
            .create_session(&NewSession {
                agent: name.into(),
                ..Default::default()
            })
            .await
            .expect("creating a session");
        let ca = std::fs::read(self.server.state.join("ca.pem")).unwrap();
        let http = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(&session.proxy_url).unwrap())
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Agent { session, http }
    }

    /// `method /echo` on the upstream as `agent`: the status the agent got.
    async fn call(&self, agent: &Agent, method: reqwest::Method) -> u16 {
        agent
            .http
            .request(method, self.upstream.url("/echo"))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .expect("request through the proxy")
            .status()
            .as_u16()
    }

    /// `ostiary --config <config> <args>`.
    async fn ostiary(&self, args: &[&str]) -> CmdOutput {
        let mut all = vec!["--config", self.config.as_str()];
        all.extend_from_slice(args);
        ostiary(&all).await
    }

    /// `audit cost <args> --json`: key → (calls, cost_micros), in the order printed.
    async fn cost_json(&self, args: &[&str]) -> Vec<(String, u64, i64)> {
        let mut all = vec!["audit", "cost"];
        all.extend_from_slice(args);
        all.push("--json");
        let out = self.ostiary(&all).await;
        assert!(out.success(), "{out}");
        out.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let row: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
                (
                    row["key"].as_str().unwrap_or_default().to_owned(),
                    row["calls"].as_u64().unwrap_or_default(),
                    row["cost_micros"].as_i64().unwrap_or_default(),
                )
            })
            .collect()
    }
}

/// The table's lines split into columns.
fn table(out: &CmdOutput) -> Vec<Vec<String>> {
    out.stdout
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn row(key: &str, calls: u64, cost_micros: i64) -> (String, u64, i64) {
    (key.to_owned(), calls, cost_micros)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_cost_adds_up_allowed_tool_calls() {
    let fx = Fixture::start().await;
    let one = fx.agent("agent-1").await;
    let two = fx.agent("agent-2").await;
    for _ in 0..3 {
        assert_eq!(fx.call(&one, reqwest::Method::GET).await, 200);
    }
    assert_eq!(fx.call(&one, reqwest::Method::POST).await, 200);
    assert_eq!(fx.call(&two, reqwest::Method::GET).await, 200);
    // Refused: never charged, whatever the catalog says it would cost.
    assert_eq!(fx.call(&one, reqwest::Method::DELETE).await, 403);

    // Records are committed asynchronously: wait for all six tool calls.
    let records = audit_query(&fx.server, &[], |r| {
        r.iter().filter(|r| r["tool"].is_string()).count() >= 6
    })
    .await;
    let tools: Vec<&Value> = records.iter().filter(|r| r["tool"].is_string()).collect();
    assert_eq!(tools.len(), 6, "{records:#?}");
    let charged: Vec<&&Value> = tools.iter().filter(|r| r["cost_micros"].is_i64()).collect();
    assert_eq!(
        charged.len(),
        5,
        "every allowed tool call carries cost_micros, the refused one none \
         (this needs the pipeline to set cost_micros): {tools:#?}"
    );

    let by_tool = fx.ostiary(&["audit", "cost"]).await;
    assert!(by_tool.success(), "{by_tool}");
    assert_eq!(
        table(&by_tool),
        [
            ["TOOL", "CALLS", "COST"],
            ["demo.read", "4", "1.000000"],
            ["demo.write", "1", "0.100000"],
            ["TOTAL", "5", "1.100000"],
        ],
        "{by_tool}"
    );

    assert_eq!(
        fx.cost_json(&["--by", "agent"]).await,
        [row("agent-1", 4, 850_000), row("agent-2", 1, 250_000)]
    );
    assert_eq!(
        fx.cost_json(&["--session", &one.session.session_id]).await,
        [row("demo.read", 3, 750_000), row("demo.write", 1, 100_000)]
    );
    assert_eq!(
        fx.cost_json(&["--session", &two.session.session_id, "--by", "session"])
            .await,
        [row(&two.session.session_id, 1, 250_000)]
    );
    assert_eq!(fx.cost_json(&["--session", "no-such-session"]).await, []);

    fx.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_then_terminate_a_session() {
    let fx = Fixture::start().await;
    let agent = fx.agent("agent-1").await;
    let id = agent.session.session_id.clone();
    assert_eq!(fx.call(&agent, reqwest::Method::GET).await, 200);

    let json = fx.ostiary(&["sessions", "show", &id, "--json"]).await;
    assert!(json.success(), "{json}");
    let shown: Value = serde_json::from_str(json.stdout.trim())
        .unwrap_or_else(|e| panic!("--json output does not parse ({e}):\n{json}"));
    assert_eq!(shown["session_id"], id.as_str(), "{shown:#}");
    assert_eq!(shown["agent"], "agent-1", "{shown:#}");
    assert_eq!(shown["state"], "live", "{shown:#}");
    assert!(shown["parent"].is_null(), "{shown:#}");
    // The one allowed `demo.read` call, metered as the audit charged it.
    assert_eq!(shown["usage"]["calls"], 1, "{shown:#}");
    assert_eq!(shown["usage"]["cost"], 0.25, "{shown:#}");

    // `session` and `sessions` are the same command.
    let text = fx.ostiary(&["session", "show", &id]).await;
    assert!(text.success(), "{text}");
    assert!(
        text.stdout.contains(&format!("session      {id}")),
        "{text}"
    );
    assert!(text.stdout.contains("state        live"), "{text}");
    assert!(text.stdout.contains("agent        agent-1"), "{text}");

    let ended = fx.ostiary(&["sessions", "terminate", &id]).await;
    assert!(ended.success(), "{ended}");
    assert_eq!(ended.stdout.trim(), format!("session {id} terminated"));

    // Its token is refused now. Plain http: the proxy answers 407 itself (a CONNECT would
    // fail inside the client before a status could be read).
    let plain = format!("http://api.example.test:{}/echo", fx.upstream.port());
    let refused = agent.http.get(&plain).send().await.expect("proxy answers");
    assert_eq!(refused.status().as_u16(), 407);

    let unknown = fx
        .ostiary(&["sessions", "terminate", "no-such-session"])
        .await;
    assert_eq!(unknown.status, 1, "{unknown}");
    let message = unknown.stderr.trim();
    assert!(
        message.starts_with("ostiary: session no-such-session") && message.lines().count() == 1,
        "{unknown}"
    );
    let unknown = fx.ostiary(&["sessions", "show", "no-such-session"]).await;
    assert_eq!(unknown.status, 1, "{unknown}");

    fx.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_live_session_is_refused() {
    let fx = Fixture::start().await;
    let agent = fx.agent("agent-1").await;
    let id = agent.session.session_id.clone();

    let out = fx.ostiary(&["sessions", "resume", &id]).await;
    // 1: the server refused (409), as opposed to 2: the command could not run.
    assert_eq!(out.status, 1, "{out}");
    assert!(out.stdout.is_empty(), "{out}");
    let message = out.stderr.trim();
    assert!(
        message.starts_with("ostiary: ") && message.lines().count() == 1,
        "{out}"
    );
    assert!(
        message.ends_with(&format!("session {id} is not paused")),
        "the server's own message is shown: {out}"
    );
    // Refused, and left alone: the session still works.
    assert_eq!(fx.call(&agent, reqwest::Method::GET).await, 200);

    fx.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_proxy_has_no_dead_letters() {
    let fx = Fixture::start().await;
    let agent = fx.agent("agent-1").await;

    let out = fx.ostiary(&["sessions", "dead-letters"]).await;
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "no dead letters", "{out}");

    let id = agent.session.session_id.as_str();
    let out = fx
        .ostiary(&["sessions", "dead-letters", "--session", id, "--json"])
        .await;
    assert!(out.success(), "{out}");
    let listed: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("--json output does not parse ({e}):\n{out}"));
    assert_eq!(listed["dead_letters"], serde_json::json!([]), "{listed:#}");

    fx.server.stop().await;
}
