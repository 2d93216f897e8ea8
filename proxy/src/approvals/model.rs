//! What an approval is: the held request, what the proxy observed about it, its state, and
//! the stored outcome. Shared by the store, the channels (page, Slack, email, CLI) and the
//! pipeline, so that every channel shows an approver the same facts.
//!
//! The state machine (each arrow is one audited transition):
//! ```text
//! pending ──approve──▶ approved ──claim──▶ executing ──▶ executed | failed | refused
//!    │ └──deny──▶ denied                       ▲   │
//!    └──deadline──▶ expired                    └───┘ crash: back to approved at start-up,
//!                                                    re-sent with the same Idempotency-Key
//! ```

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Hex SHA-256: how held bodies and request identities are compared.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Where an approval is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for a human.
    Pending,
    /// A human said yes; not yet claimed for execution.
    Approved,
    /// Claimed by the executor: the upstream call may be under way.
    Executing,
    /// Executed once; the upstream's response is stored.
    Executed,
    /// Approved, but the execution could not reach a response (upstream error, timeout,
    /// credential unavailable). Not retried: whether it took effect is unknown.
    Failed,
    /// Approved, but re-authorization at execution refused it (policy changed, session
    /// revoked or expired). Nothing was sent.
    Refused,
    /// A human said no.
    Denied,
    /// The deadline passed without a decision.
    Expired,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Approved => "approved",
            Status::Executing => "executing",
            Status::Executed => "executed",
            Status::Failed => "failed",
            Status::Refused => "refused",
            Status::Denied => "denied",
            Status::Expired => "expired",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => Status::Pending,
            "approved" => Status::Approved,
            "executing" => Status::Executing,
            "executed" => Status::Executed,
            "failed" => Status::Failed,
            "refused" => Status::Refused,
            "denied" => Status::Denied,
            "expired" => Status::Expired,
            _ => return None,
        })
    }

    /// No further transition happens from here.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Status::Executed | Status::Failed | Status::Refused | Status::Denied | Status::Expired
        )
    }

    /// A human may still decide.
    pub fn is_open(self) -> bool {
        self == Status::Pending
    }
}

/// A human's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Approve,
    Deny,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Approve => "approve",
            Verdict::Deny => "deny",
        }
    }
}

/// Through which channel a decision arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// The control API (and the CLI, which calls it) with the admin token.
    Api,
    /// The web page behind a signed link (from email, Slack or the CLI).
    Page,
    /// A Slack interactive button, verified with the signing secret.
    Slack,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Api => "api",
            Channel::Page => "page",
            Channel::Slack => "slack",
        }
    }
}

/// The request as it will be sent, minus the agent's credentials (Authorization, Cookie,
/// Proxy-*) and hop-by-hop headers. The broker's credential is injected at execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldRequest {
    pub method: String,
    /// Absolute URL (`https://host:port/path?query`), as classified.
    pub url: String,
    pub headers: Vec<(String, String)>,
    #[serde(with = "base64_bytes")]
    pub body: Vec<u8>,
    /// Hex SHA-256 of the body: the agent's retry must carry the same body.
    pub body_digest: String,
}

/// What the proxy itself observed: the page shows this, never the agent's own summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observed {
    pub host: String,
    pub port: u16,
    pub scheme: String,
    /// Cedar action (`Ostiary::Action::"tool:payments.refund"`) and resource uid texts.
    pub action: String,
    pub resource: String,
    /// Catalogued tool and tier, when the request is a tool call.
    pub tool: Option<String>,
    pub tier: Option<String>,
    /// The tool's arguments as the proxy parsed them (what policy saw).
    pub args: Option<serde_json::Value>,
    /// Hex SHA-256 of the canonical JSON of `args`.
    pub args_hash: Option<String>,
    /// `impact.records` extracted by the catalog, and the tool's cost.
    pub records: Option<i64>,
    pub cost: Option<f64>,
    /// For an MCP `tools/call`: its JSON-RPC id. The held body is that one call; a retry is
    /// matched on the call without its id (clients number requests afresh) and answered
    /// with the retry's own id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc_id: Option<serde_json::Value>,
}

/// The upstream's answer, as stored for the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    #[serde(with = "base64_bytes")]
    pub body: Vec<u8>,
    /// The body was longer than `approvals.max_response_bytes` and was cut.
    pub truncated: bool,
}

/// One approval, whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: String,
    pub status: Status,
    pub created_ms: i64,
    /// The hard deadline: `approval_expired` after it.
    pub deadline_ms: i64,
    /// When approvers are notified again if nobody decided.
    pub renotify_ms: i64,
    /// Notification rounds so far (1 after the first).
    pub rounds: u32,
    pub session: String,
    pub agent: String,
    pub tenant: String,
    /// The request id of the agent's request that was held.
    pub request_id: String,
    /// Policies that determined the escalation, and the policy-set generation then.
    pub policies: Vec<String>,
    pub policy_generation: u64,
    pub request: HeldRequest,
    pub observed: Observed,
    /// Who decided, how, when, and why (deny reasons, refusal reasons).
    pub approver: Option<String>,
    pub channel: Option<Channel>,
    pub decided_ms: Option<i64>,
    pub reason: Option<String>,
    /// Executions started (more than one only after a crash mid-execution).
    pub attempts: u32,
    pub result: Option<StoredResponse>,
}

/// What a new approval is about: who asked, what is held, and why.
#[derive(Debug)]
pub struct Ask<'a> {
    pub principal: &'a crate::session::Principal,
    pub request_id: String,
    pub policies: Vec<String>,
    pub policy_generation: u64,
    pub request: HeldRequest,
    pub observed: Observed,
}

impl Approval {
    /// A new pending approval, with the queue's `ttl` and `deadline` from now.
    pub fn pending(config: &crate::config::Approvals, ask: Ask<'_>, now_ms: i64) -> Self {
        Approval {
            id: super::queue::ApprovalQueue::new_id(),
            status: Status::Pending,
            created_ms: now_ms,
            deadline_ms: now_ms + config.deadline.as_millis() as i64,
            renotify_ms: now_ms + config.ttl.as_millis() as i64,
            rounds: 1,
            session: ask.principal.session_id.clone(),
            agent: ask.principal.agent.clone(),
            tenant: ask.principal.tenant.clone(),
            request_id: ask.request_id,
            policies: ask.policies,
            policy_generation: ask.policy_generation,
            request: ask.request,
            observed: ask.observed,
            approver: None,
            channel: None,
            decided_ms: None,
            reason: None,
            attempts: 0,
            result: None,
        }
    }

    /// The `Idempotency-Key` every execution of this approval carries, the same across
    /// retries after a crash, so an upstream that honours it applies the request once.
    pub fn idempotency_key(&self) -> String {
        format!("ostiary-{}", self.id)
    }

    /// One line for lists and notifications: `tool` (or `METHOD host/path`) for `agent`.
    pub fn summary(&self) -> String {
        match &self.observed.tool {
            Some(tool) => format!("{tool} on {} for {}", self.observed.host, self.agent),
            None => format!(
                "{} {} for {}",
                self.request.method, self.request.url, self.agent
            ),
        }
    }
}

/// Bytes as standard base64 in JSON (bodies are not always UTF-8).
mod base64_bytes {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}
