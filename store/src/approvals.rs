//! The approvals aggregate: what an approval is (the held request, what the proxy observed
//! about it, its state, the stored outcome), and the store that moves it through its states
//! exactly once, with what must commit together with it — single-use link nonces, Slack
//! callback signatures already seen, the bounds on holds (each session's cap, the
//! fingerprints identical holds are joined on) and the notification outbox.
//!
//! The state machine (each arrow is one audited transition):
//! ```text
//! pending ──approve──▶ approved ──claim──▶ executing ──▶ executed | failed | refused
//!    │ └──deny──▶ denied                       ▲   │
//!    └──deadline──▶ expired                    └───┘ crash: back to approved at start-up,
//!                                                    re-sent with the same Idempotency-Key
//! ```

use serde::{Deserialize, Serialize};

use crate::StoreError;

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
    /// The version of the policy set that held it (`None`: held by no policy decision, e.g.
    /// a watchdog's resume question or a trigger's run, or by an Ostiary from before
    /// versions).
    #[serde(default)]
    pub held_policy_version: Option<String>,
    /// The version of the policy set its execution was decided again under (`None`: not
    /// executed, or not decided again — a resume, a run, a session gone meanwhile).
    #[serde(default)]
    pub executed_policy_version: Option<String>,
}

impl Approval {
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

/// Why a decision was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no approval {0}")]
    Unknown(String),
    #[error("approval is already {}", .0.as_str())]
    NotPending(Status),
    #[error("this link was already used")]
    LinkUsed,
    #[error("{0:?} is not one of the configured approvers")]
    NotApprover(String),
    #[error("the agent that made a request cannot approve it")]
    SelfApproval,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Counts for gauges and the CLI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub pending: i64,
    pub approved: i64,
    pub executing: i64,
    /// Deliveries that failed at least once and are not yet delivered.
    pub failing_deliveries: i64,
}

/// The durable approval queue. Every transition happens once or not at all: two executors
/// (tasks of one process, or processes on one database) can never both claim an approval,
/// and a decision racing the deadline is a decision or an expiry, never both. Nothing is
/// acknowledged before it is durable.
pub trait ApprovalStore: Send + Sync + std::fmt::Debug {
    /// Store a new pending approval.
    fn insert(&self, a: &Approval) -> Result<(), StoreError>;
    /// One approval.
    fn get(&self, id: &str) -> Result<Option<Approval>, StoreError>;
    /// Approvals, newest first, optionally of one status and one session.
    fn list(
        &self,
        status: Option<Status>,
        session: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Approval>, StoreError>;
    /// Record a human's decision on a pending approval, consuming the link nonce it came
    /// with (if any) in the same transaction: a used link never decides again, and a
    /// refused decision does not burn the link. Past its deadline an approval is expired,
    /// even before the sweep says so.
    fn decide(&self, decision: &Decision<'_>) -> Result<Approval, DecideError>;
    /// Whether a link nonce was already used.
    fn link_used(&self, nonce: &str) -> Result<bool, StoreError>;
    /// Claim an approved approval for execution: `approved → executing`, attempts + 1.
    /// `None` when someone else claimed it, or it is not approved.
    fn claim(&self, id: &str, now_ms: i64) -> Result<Option<Approval>, StoreError>;
    /// End an execution: `executing → executed | failed | refused`, with the stored
    /// response (executed) or the reason (failed, refused), and the version of the policy
    /// set that decided the execution, if one did. False if it was not executing.
    fn finish(
        &self,
        id: &str,
        status: Status,
        result: Option<&StoredResponse>,
        reason: Option<&str>,
        executed_policy_version: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Executions claimed and not heard of since `stale_before_ms` (their claim's lease ran
    /// out: the executor died) go back to `approved`, to be re-sent with the same
    /// idempotency key. Their ids. At a lone process's start every claim is stale.
    fn recover(&self, now_ms: i64, stale_before_ms: i64) -> Result<Vec<String>, StoreError>;
    /// The executor of a claimed approval is alive: its claim's lease runs from `now_ms`.
    /// False when it is no longer executing (finished, or recovered by another).
    fn renew(&self, id: &str, now_ms: i64) -> Result<bool, StoreError>;
    /// The executor of a claimed approval is shutting down: `executing → approved`, for
    /// whoever claims it next (with the same idempotency key). False when it was not executing.
    fn release(&self, id: &str, now_ms: i64) -> Result<bool, StoreError>;
    /// Ids of approvals waiting for the executor, oldest decision first.
    fn approved(&self) -> Result<Vec<String>, StoreError>;
    /// Expire every pending approval past its deadline; returns them, now `expired`.
    fn expire_due(&self, now_ms: i64) -> Result<Vec<Approval>, StoreError>;
    /// Expire every pending approval of an ended session and forget its cap and hold
    /// fingerprints; returns the approvals, now `expired`.
    fn expire_session(&self, session: &str, now_ms: i64) -> Result<Vec<Approval>, StoreError>;
    /// Withdraw the pending "resume this paused session?" questions of `session` (their
    /// URL is `ostiary:session/…`); returns them, now `expired` with `reason`.
    fn withdraw_resume(
        &self,
        session: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Vec<Approval>, StoreError>;
    /// Start a new notification round for every pending approval whose reminder is due:
    /// rounds + 1, the next one `ttl_ms` later. Returns them, updated.
    fn renotify_due(&self, now_ms: i64, ttl_ms: i64) -> Result<Vec<Approval>, StoreError>;
    /// Remember a Slack callback signature; false if it was seen before (a replay).
    /// Signatures older than the callback window (11 minutes) are forgotten.
    fn slack_first_seen(&self, signature: &str, now_ms: i64) -> Result<bool, StoreError>;
    /// Counts for gauges and `approvals list`.
    fn counts(&self) -> Result<QueueCounts, StoreError>;

    /// Remember `session`'s cap on pending holds and its parent (whose cap its holds count
    /// against too).
    fn set_cap(&self, session: &str, parent: Option<&str>, max: u32) -> Result<(), StoreError>;
    /// `session`'s stored cap, if it has one.
    fn cap(&self, session: &str) -> Result<Option<u32>, StoreError>;
    /// Pending holds of `session` and its descendants (what its cap counts).
    fn pending_holds(&self, session: &str, now_ms: i64) -> Result<u32, StoreError>;
    /// Join, refuse or store a hold, atomically: the same request of the same session
    /// already pending is joined; a hold one more of which would pass the cap of the
    /// session or of any ancestor is refused; otherwise the approval, its fingerprint and
    /// its first notifications are stored together.
    fn hold_bounded(&self, hold: Hold<'_>, now_ms: i64) -> Result<Admission, StoreError>;

    /// Owe one notification (idempotent per approval, channel, recipient and round).
    fn enqueue(
        &self,
        approval_id: &str,
        channel: &str,
        recipient: &str,
        round: u32,
        now_ms: i64,
    ) -> Result<(), StoreError>;
    /// Deliveries due now, oldest first; none to a recipient whose rate limit is closed.
    fn due_deliveries(&self, now_ms: i64, limit: usize) -> Result<Vec<Delivery>, StoreError>;
    /// Every delivery due now to one recipient, oldest first (a digest takes them all).
    fn due_for(
        &self,
        channel: &str,
        recipient: &str,
        now_ms: i64,
    ) -> Result<Vec<Delivery>, StoreError>;
    /// A delivery went through.
    fn delivered(&self, id: i64, now_ms: i64) -> Result<(), StoreError>;
    /// A delivery failed; try again at `next_ms`. The error names the cause, never a
    /// secret.
    fn delivery_failed(&self, id: i64, error: &str, next_ms: i64) -> Result<(), StoreError>;
    /// A delivery no longer worth making (the approval was decided meanwhile).
    fn delivery_dropped(&self, id: i64, now_ms: i64) -> Result<(), StoreError>;
    /// A recipient's rate state (the default for one never sent to).
    fn recipient_state(&self, channel: &str, recipient: &str)
        -> Result<RecipientState, StoreError>;
    /// Something was sent to a recipient: closed until `open_ms`, and collecting if any
    /// notification to it is still unsent (read after the sent ones were marked).
    fn close_recipient(
        &self,
        channel: &str,
        recipient: &str,
        open_ms: i64,
    ) -> Result<(), StoreError>;
    /// The notifications of one approval, in the order they were owed.
    fn deliveries_of(&self, approval_id: &str) -> Result<Vec<DeliveryState>, StoreError>;
}

/// A human's decision, as [`ApprovalStore::decide`] records it.
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    pub id: &'a str,
    pub verdict: Verdict,
    pub approver: &'a str,
    pub channel: Channel,
    pub reason: Option<&'a str>,
    /// The signed link's nonce, consumed with the decision.
    pub nonce: Option<&'a str>,
    pub now_ms: i64,
}

/// What a bounded hold came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Stored as a new pending approval, its notifications owed.
    Held,
    /// The same request (same fingerprint) of the same session is already pending: that
    /// approval, unchanged; nothing stored, nobody notified again.
    Joined(Box<Approval>),
    /// A cap is reached; nothing stored.
    Full(CapReached),
}

/// The cap a hold ran into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapReached {
    /// The session whose cap it is: the holder itself or one of its ancestors.
    pub session: String,
    /// Pending holds counted against it (its own and its descendants').
    pub used: u32,
    pub max: u32,
    /// When the first of them reaches its deadline, if any does: a slot is free by then
    /// at the latest, whatever the approvers do.
    pub frees_at_ms: Option<i64>,
}

/// A hold to admit: the approval, what makes it identical to another, and who to tell.
#[derive(Debug)]
pub struct Hold<'a> {
    pub approval: &'a Approval,
    /// Hex SHA-256 of method, URL and body (an MCP call's without its JSON-RPC id).
    pub fingerprint: &'a str,
    /// The cap of a session that has none stored (created before caps were).
    pub default_max: u32,
    /// `(channel, recipient)` owed a first notification if it is held.
    pub notify: &'a [(&'static str, String)],
}

/// One notification owed to one recipient on one channel for one round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: i64,
    pub approval_id: String,
    /// `slack` or `email`.
    pub channel: String,
    /// The approver mailed; empty for Slack (one message to the webhook's channel).
    pub recipient: String,
    pub round: u32,
    pub attempts: u32,
}

/// A recipient's rate state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecipientState {
    /// Nothing is sent to the recipient before this (0: never sent to).
    pub open_ms: i64,
    /// Notifications came due while it was closed: the next send is a digest.
    pub collecting: bool,
}

/// Where one notification stands.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeliveryState {
    pub channel: String,
    pub recipient: String,
    pub round: u32,
    pub attempts: u32,
    pub sent_ms: Option<i64>,
    pub last_error: Option<String>,
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
