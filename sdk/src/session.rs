//! Sessions as the control API makes and shows them: what to ask for ([`NewSession`]), what
//! comes back ([`Session`]), and a live session's state ([`SessionStatus`]); with the two
//! ways an agent uses one — the environment of a child process ([`Session::env`]) and a
//! `reqwest` client already pointed at the proxy ([`Session::client_builder`],
//! [`Session::client`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::agent::AgentClient;
use crate::errors::SdkError;

/// Environment variables naming the CA bundle, for the clients that read each (docs/design.md §7).
pub const CA_BUNDLE_VARS: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

/// Both spellings, because clients differ in which one they read.
const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// What to ask for when creating a session (`POST /v1/sessions`). Every limit left out is
/// the proxy's `[sessions]` default for a root session, and carved out of what its parent
/// has left for a child.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewSession {
    /// The agent's name. Required for a root session; a child left without one runs as its
    /// parent's agent, and under another name only if policy permits the spawn.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub agent: String,
    /// The tenant (`default` when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Lifetime, e.g. `"30m"` (`[sessions] default_ttl` when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Tool calls the session may make.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    /// Cost (in the catalog's unit) the session may spend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Bytes the session may send upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes_sent: Option<u64>,
    /// Bytes the session may receive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bytes_received: Option<u64>,
    /// Requests the session may have held for approval at once (the proxy's `[sessions]`
    /// default when absent; a child's at most its parent's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pending_approvals: Option<u32>,
    /// The sandbox profile the session's agent runs under (`context.session.profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The parent session's id, for an operator creating a child on its behalf (admin
    /// token). A session creating its own child uses
    /// [`ControlClient::create_child`](crate::ControlClient::create_child) instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// A created session: who it is and how to use it. `Debug` shows neither the token nor the
/// proxy URL (which embeds it).
#[derive(Clone, Serialize, Deserialize)]
pub struct Session {
    /// The session's id (`ses_…`).
    pub session_id: String,
    /// The agent it runs as.
    pub agent: String,
    /// Its tenant.
    pub tenant: String,
    /// The session token: the proxy credential. Keep it out of logs.
    pub token: String,
    /// Seconds since the epoch.
    pub expires_at: i64,
    /// `http://agent:<token>@host:port`, the form every HTTP client takes for `HTTPS_PROXY`.
    pub proxy_url: String,
    /// The proxy's CA certificate (PEM), which its clients must trust.
    pub ca_pem: String,
    /// Placeholder variables for the credentials the session may use
    /// (`GITHUB_TOKEN=ostiary:github`): worthless outside the proxy, swapped for the secret
    /// only towards the credential's hosts.
    #[serde(default)]
    pub placeholders: BTreeMap<String, String>,
    /// The parent session, for a child.
    #[serde(default)]
    pub parent: Option<String>,
    /// Spawn depth: 0 for a root session, its parent's plus one for a child.
    #[serde(default)]
    pub depth: u32,
    /// The limits it got (`max_calls`, `max_cost`, ...): what it asked for, its parent's
    /// carving, or the proxy's defaults.
    #[serde(default)]
    pub limits: Map<String, Value>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("session_id", &self.session_id)
            .field("agent", &self.agent)
            .field("tenant", &self.tenant)
            .field("token", &"***")
            .field("expires_at", &self.expires_at)
            .field("parent", &self.parent)
            .field("depth", &self.depth)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// The variables a child process needs: proxy URLs (both cases, as clients differ) with
    /// the token, and the CA bundle at `ca_path`. `NO_PROXY` is cleared so nothing bypasses.
    pub fn env(&self, ca_path: &Path) -> Vec<(String, String)> {
        let mut env = Vec::new();
        for name in PROXY_VARS {
            env.push((name.to_owned(), self.proxy_url.clone()));
        }
        env.push(("NO_PROXY".to_owned(), String::new()));
        env.push(("no_proxy".to_owned(), String::new()));
        for name in CA_BUNDLE_VARS {
            env.push((name.to_owned(), ca_path.display().to_string()));
        }
        env.push(("OSTIARY_SESSION_ID".to_owned(), self.session_id.clone()));
        for (name, value) in &self.placeholders {
            env.push((name.clone(), value.clone()));
        }
        env
    }

    /// A `reqwest` client builder that sends everything through this session's proxy (with
    /// its token) and trusts the proxy's CA besides the usual roots. The environment's
    /// proxy variables are ignored: this client is the session's, whatever the process's
    /// environment says. Add timeouts and the like, then `build()` — or wrap the client in
    /// an [`AgentClient`] with [`AgentClient::with_http`] to get Ostiary's refusals typed.
    pub fn client_builder(&self) -> Result<reqwest::ClientBuilder, SdkError> {
        let proxy = reqwest::Proxy::all(self.proxy_url.as_str()).map_err(|_| {
            SdkError::Config(format!(
                "session {}: its proxy URL is not a URL a client can use",
                self.session_id
            ))
        })?;
        let certificates = reqwest::Certificate::from_pem_bundle(self.ca_pem.as_bytes())
            .ok()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                SdkError::Config(format!(
                    "session {}: its CA is not a PEM certificate",
                    self.session_id
                ))
            })?;
        let mut builder = reqwest::Client::builder().proxy(proxy);
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
        Ok(builder)
    }

    /// An [`AgentClient`] for this session: [`Session::client_builder`] with the SDK's
    /// timeouts, raising Ostiary's refusals as [`SdkError`]s and able to wait for a held
    /// request.
    pub fn client(&self) -> Result<AgentClient, SdkError> {
        AgentClient::new(self)
    }
}

/// A live session as `GET /v1/sessions/{id}` shows it: whether it is paused (and why), what
/// it used against its limits, and its live children.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct SessionStatus {
    /// The session's id.
    pub session_id: String,
    /// The agent it runs as.
    pub agent: String,
    /// Its tenant.
    pub tenant: String,
    /// The parent session, for a child.
    #[serde(default)]
    pub parent: Option<String>,
    /// Spawn depth.
    #[serde(default)]
    pub depth: u32,
    /// `live` or `paused`.
    pub state: String,
    /// While paused: `{"reason", "kind", "at", "dead_letter"}`.
    #[serde(default)]
    pub paused: Option<Value>,
    /// What it used: `calls`, `cost`, `bytes_sent`, `bytes_received`.
    #[serde(default)]
    pub usage: Map<String, Value>,
    /// Its limits: `max_calls`, `max_cost`, ...
    #[serde(default)]
    pub limits: Map<String, Value>,
    /// The ids of its live children.
    #[serde(default)]
    pub children: Vec<String>,
}

impl SessionStatus {
    /// Whether the watchdog paused it.
    pub fn is_paused(&self) -> bool {
        self.state == "paused"
    }

    /// Why the watchdog paused it, while it is paused.
    pub fn paused_reason(&self) -> Option<&str> {
        self.paused.as_ref()?.get("reason")?.as_str()
    }
}
