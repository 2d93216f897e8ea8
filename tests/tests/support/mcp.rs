//! The MCP rig the MCP end-to-end tests share: the MCP Python SDK's server behind TLS from a
//! test CA as the upstream, a proxy whose catalog lists its tools, and a session; requests go
//! through an intercepted tunnel as hand-written JSON-RPC, or through the SDK's own client.
#![allow(dead_code)]

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use ostiary_e2e::clients::PyTlsServer;
use ostiary_e2e::pki::TestCa;
use ostiary_e2e::proxy::{ProxySpec, TestProxy};
use ostiary_e2e::raw::{self, Reply};
use serde_json::{json, Value};

pub const HOST: &str = "mcp.example.test";

/// What the shipped library permits for its MCP server, for this endpoint: the session
/// plumbing of both revisions (a literal, for `concat!` with a test's own policies).
#[macro_export]
macro_rules! mcp_plumbing {
    () => {
        r#"
@id("mcp-plumbing")
permit (principal, action == Ostiary::Action::"mcp", resource == Ostiary::Host::"mcp.example.test")
when {
  ["initialize", "ping", "tools/list", "server/discover"].contains(context.method) ||
  context.method like "notifications/*"
};
"#
    };
}

pub fn tools_toml(port: u16) -> String {
    let url = format!("https://{HOST}:{port}/mcp");
    format!(
        r#"
[[tool]]
name = "files.read"
tier = "read"
match = {{ mcp = "{url}", tool = "read_file" }}

[[tool]]
name = "files.write"
tier = "write"
match = {{ mcp = "{url}", tool = "write_file" }}
args_schema = {{ type = "object", properties = {{ path = {{ type = "string", pattern = "^/[a-z]+[.]txt$" }}, content = {{ type = "string" }} }} }}
cost = 0.5

[[tool]]
name = "files.delete"
tier = "irreversible"
match = {{ mcp = "{url}", tool = "delete_file" }}
"#
    )
}

/// The SDK's MCP server on a port of its own, killed on drop.
pub struct McpServer {
    pub port: u16,
    _server: PyTlsServer,
}

impl McpServer {
    /// Start `mcp_server.py` with `flags`, on a free port, and wait until it accepts
    /// connections.
    pub async fn start(ca: &TestCa, flags: &[&str]) -> Self {
        let server = PyTlsServer::start(ca, &[HOST], "mcp_server.py", |_| {
            flags.iter().map(Into::into).collect()
        })
        .await;
        Self {
            port: server.port,
            _server: server,
        }
    }

    pub fn url(&self) -> String {
        format!("https://{HOST}:{}/mcp", self.port)
    }
}

pub struct Rig {
    pub server: McpServer,
    pub proxy: TestProxy,
    pub token: String,
    pub env: Vec<(String, String)>,
}

impl Rig {
    pub async fn start(flags: &[&str], policies: &str) -> Self {
        Self::start_with(flags, policies, "").await
    }

    /// With other policies and extra config (`[tiers.*]`, `[checks.*]`).
    pub async fn start_with(flags: &[&str], policies: &str, extra_toml: &str) -> Self {
        let ca = TestCa::new();
        let server = McpServer::start(&ca, flags).await;
        let proxy = TestProxy::start(ProxySpec {
            policies: policies.into(),
            tools_toml: Some(tools_toml(server.port)),
            names: vec![HOST.into()],
            ports: vec![server.port],
            upstream_ca_pem: Some(ca.ca_pem()),
            extra_toml: extra_toml.into(),
            ..Default::default()
        })
        .await;
        let session = proxy.session("agent-1").await;
        let env = proxy.client_env(&session);
        Self {
            server,
            proxy,
            token: session.token.clone(),
            env,
        }
    }

    /// POST `body` to the endpoint through an intercepted tunnel, as a raw JSON-RPC client.
    pub async fn post(&self, body: impl Into<Bytes>) -> Reply {
        self.post_as(&self.token, &[], body).await
    }

    /// [`Self::post`] as the session of `token`, with extra `headers`.
    pub async fn post_as(
        &self,
        token: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Reply {
        let tls =
            raw::intercepted(&self.proxy, token, HOST, self.server.port, &[b"http/1.1"]).await;
        let mut sender = raw::h1(tls).await;
        let mut req = Request::post("/mcp")
            .header("host", format!("{HOST}:{}", self.server.port))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        // The 2025 revision unless the caller names one (two would be refused).
        if !headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("mcp-protocol-version"))
        {
            req = req.header("mcp-protocol-version", "2025-06-18");
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let req = req.body(Full::new(body.into())).unwrap();
        raw::send_h1(&mut sender, req).await.expect("exchange")
    }
}

pub fn call(id: u64, tool: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": {"path": "/notes.txt"}}})
}
