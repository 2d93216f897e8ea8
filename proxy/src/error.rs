//! The typed refusals and failures of the request path. Each variant is one row of the
//! response table in docs/design.md §5 and carries the reason, so that the response, the
//! audit record and the log all say the same thing. Mapping to HTTP lives in
//! [`crate::respond`] only.

/// Who is at fault, for logs and metrics (pingora's "which side failed").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Agent,
    Policy,
    Upstream,
    Internal,
}

/// Everything that stops a request from being forwarded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProxyError {
    #[error("proxy authentication failed: {reason}")]
    Unauthenticated { reason: String },
    #[error("malformed request: {reason}")]
    BadRequest { reason: String },
    #[error("request header fields too large")]
    HeadersTooLarge,
    /// A body that must be read whole (a tool call's arguments) is larger than allowed.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("request for {host} inside a tunnel to {tunnel}")]
    Misdirected { tunnel: String, host: String },
    #[error("denied by policy: {reason}")]
    Denied {
        policies: Vec<String>,
        action: String,
        resource: String,
        reason: String,
    },
    /// Denied only by `@escalate("approval")` forbids: a human's approval would allow it.
    #[error("approval required by policy: {}", .policies.join(", "))]
    ApprovalRequired {
        policies: Vec<String>,
        action: String,
        resource: String,
    },
    /// Held for a human: stored durably, approvers notified (202).
    #[error("held for approval {approval_id} ({status})")]
    ApprovalPending {
        approval_id: String,
        status_url: String,
        /// RFC 3339: when the approval expires if nobody decides.
        expires_at: String,
        /// `pending`, `approved` or `executing`.
        status: &'static str,
    },
    /// A human said no.
    #[error("approval {approval_id} was denied by {approver}")]
    ApprovalDenied {
        approval_id: String,
        approver: String,
        reason: Option<String>,
    },
    /// Nobody decided before the deadline.
    #[error("approval {approval_id} expired without a decision")]
    ApprovalExpired { approval_id: String },
    /// Approved, but not executed: re-authorization refused it (`refused`) or the execution
    /// could not reach a response (`failed`).
    #[error("approval {approval_id} was approved but {status}: {reason}")]
    ApprovalNotExecuted {
        approval_id: String,
        status: &'static str,
        reason: String,
    },
    /// `Ostiary-Approval` names no approval of this session, or a different request.
    #[error("Ostiary-Approval {approval_id}: {reason}")]
    ApprovalMismatch {
        approval_id: String,
        reason: &'static str,
    },
    /// A request to be held is larger than `approvals.max_body_bytes`.
    #[error("request body larger than the {limit} bytes an approval holds")]
    ApprovalBodyTooLarge { limit: usize },
    /// A check on the request's content failed (`check` names it: `args_schema`, ...).
    #[error("check {check} failed: {detail}")]
    CheckFailed { check: String, detail: String },
    /// A session limit (budget, bytes, rate, spawn bounds) was reached (429). Boxed: the
    /// figures would make every `Result` of the request path larger.
    #[error("limit {} reached ({} of {})", .0.limit, .0.used, .0.max)]
    LimitExceeded(Box<crate::guardrails::meter::LimitHit>),
    /// The watchdog paused the session until a human resumes it (423).
    #[error("session paused: {reason}")]
    SessionPaused { reason: String },
    /// An `Idempotency-Key` already used for another request of the session (422).
    #[error("Idempotency-Key {key} was used for a different request")]
    IdempotencyMismatch { key: String },
    /// An `Idempotency-Key` whose first request is still running, or whose outcome was too
    /// large to keep (409): running it again could apply it twice.
    #[error("Idempotency-Key {key}: {reason}")]
    IdempotencyConflict { key: String, reason: &'static str },
    #[error("destination {address} is blocked: {reason}")]
    DestinationBlocked { address: String, reason: String },
    /// A placeholder (`ostiary:<name>`) was sent to a host its credential is not bound to
    /// (`point` is `None`), or to a bound host anywhere but the binding's injection point
    /// (`point` names it). `at` says where it was found.
    #[error(
        "placeholder exfiltration: the placeholder of credential {credential} was sent in the \
         {at} of a request to {host}, {}",
        .point.as_ref().map_or_else(
            || "which the credential is not bound to".to_owned(),
            |point| format!("where it may only stand in the {point}"),
        )
    )]
    PlaceholderExfiltration {
        credential: String,
        host: String,
        at: String,
        point: Option<String>,
    },
    /// A placeholder of another session (a parent's, in a child session) was sent.
    #[error("placeholder of credential {credential} belongs to another session")]
    PlaceholderForeign { credential: String },
    /// A credential bound to the host cannot be sent with this request: over plain http
    /// (`credential_needs_tls`), or on a WebSocket upgrade whose frames could echo it back
    /// unscrubbed (`credential_over_upgrade`).
    #[error("credential {credential} refused for this request: {reason}")]
    CredentialRefused {
        credential: String,
        reason: &'static str,
    },
    /// The broker could not produce the credential (Vault sealed, down or denying; a
    /// quarantined lease; a value unusable in a header). `cause` is a short kind, never a value.
    #[error("credential {credential} unavailable: {cause}")]
    CredentialUnavailable { credential: String, cause: String },
    #[error("upstream failed: {reason}")]
    Upstream { reason: String },
    #[error("upstream did not answer in time: {reason}")]
    UpstreamTimeout { reason: String },
    #[error("internal error: {reason}")]
    Internal { reason: String },
    /// Audit records cannot be written (disk full, I/O error, database locked, queue full):
    /// nothing is forwarded until they can (503). `reason` is for the record and the log.
    #[error("audit trail unavailable: {reason}")]
    AuditUnavailable { reason: String },
    /// Shared state a decision needs cannot be reached (`component`: `redis`, `store`):
    /// budgets and rate limits fail closed (503). `reason` is for the record and the log.
    #[error("shared state unavailable ({component}): {reason}")]
    StateUnavailable {
        component: &'static str,
        reason: String,
    },
    /// A request to the proxy's own name (`ostiary.internal`, a run's checkpoint) that it
    /// does not serve: no such path or no run (404), a method it does not take (405), a
    /// body over its bound (413). Nothing was forwarded: the name never leaves the proxy.
    #[error("{reason}")]
    NotServed { status: u16, reason: String },
    /// Refused JSON-RPC calls to a catalogued MCP endpoint, none of which was forwarded:
    /// answered HTTP 200 with one JSON-RPC error per call (docs/design.md §5), so MCP SDKs raise a
    /// readable error and the MCP session stays usable. Never empty; each refusal is one of
    /// the other variants (denied, approval required, check failed).
    #[error("MCP call refused: {}", .replies.first().map(|r| r.error.to_string()).unwrap_or_default())]
    McpRefused {
        replies: Vec<McpRefusal>,
        /// Whether the agent sent a batch (the answer is then a JSON array).
        batch: bool,
        /// The client follows held calls up (MCP 2026-07-28, [`crate::mcp::rounds`]): a
        /// call held for approval is answered `input_required`, not `-32002`.
        follow_up: bool,
    },
}

/// One refused JSON-RPC call: its `id` (echoed in the error) and why.
#[derive(Debug, Clone)]
pub struct McpRefusal {
    pub id: serde_json::Value,
    pub error: ProxyError,
}

impl ProxyError {
    /// The `error` kind of the JSON body (docs/design.md §5).
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::Unauthenticated { .. } => "unauthenticated",
            ProxyError::BadRequest { .. }
            | ProxyError::HeadersTooLarge
            | ProxyError::BodyTooLarge { .. } => "bad_request",
            ProxyError::Misdirected { .. } => "misdirected_request",
            ProxyError::Denied { .. } => "denied",
            ProxyError::ApprovalRequired { .. } => "approval_required",
            ProxyError::ApprovalPending { .. } => "approval_pending",
            ProxyError::ApprovalDenied { .. } => "approval_denied",
            ProxyError::ApprovalExpired { .. } => "approval_expired",
            ProxyError::ApprovalNotExecuted { status, .. } => {
                if *status == "failed" {
                    "upstream_error"
                } else {
                    "denied"
                }
            }
            ProxyError::ApprovalMismatch { .. } | ProxyError::ApprovalBodyTooLarge { .. } => {
                "bad_request"
            }
            ProxyError::CheckFailed { .. } => "check_failed",
            ProxyError::LimitExceeded(_) => "limit_exceeded",
            ProxyError::SessionPaused { .. } => "session_paused",
            ProxyError::IdempotencyMismatch { .. } => "idempotency_mismatch",
            ProxyError::IdempotencyConflict { .. } => "idempotency_conflict",
            ProxyError::DestinationBlocked { .. } => "destination_blocked",
            ProxyError::PlaceholderExfiltration { .. }
            | ProxyError::PlaceholderForeign { .. }
            | ProxyError::CredentialRefused { .. } => "denied",
            ProxyError::CredentialUnavailable { .. } => "credential_unavailable",
            ProxyError::Upstream { .. } => "upstream_error",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
            ProxyError::Internal { .. } => "internal_error",
            ProxyError::AuditUnavailable { .. } => "audit_unavailable",
            ProxyError::StateUnavailable { .. } => "state_unavailable",
            ProxyError::NotServed { status: 404, .. } => "not_found",
            ProxyError::NotServed { .. } => "bad_request",
            ProxyError::McpRefused { replies, .. } => {
                replies.first().map_or("denied", |r| r.error.kind())
            }
        }
    }

    /// Which side failed.
    pub fn side(&self) -> Side {
        match self {
            ProxyError::Unauthenticated { .. }
            | ProxyError::BadRequest { .. }
            | ProxyError::HeadersTooLarge
            | ProxyError::BodyTooLarge { .. }
            | ProxyError::CheckFailed { .. }
            | ProxyError::ApprovalMismatch { .. }
            | ProxyError::ApprovalBodyTooLarge { .. }
            | ProxyError::IdempotencyMismatch { .. }
            | ProxyError::IdempotencyConflict { .. }
            | ProxyError::Misdirected { .. }
            | ProxyError::NotServed { .. } => Side::Agent,
            ProxyError::LimitExceeded(_) | ProxyError::SessionPaused { .. } => Side::Policy,
            ProxyError::Denied { .. }
            | ProxyError::ApprovalRequired { .. }
            | ProxyError::ApprovalPending { .. }
            | ProxyError::ApprovalDenied { .. }
            | ProxyError::ApprovalExpired { .. }
            | ProxyError::DestinationBlocked { .. }
            | ProxyError::PlaceholderExfiltration { .. }
            | ProxyError::PlaceholderForeign { .. }
            | ProxyError::CredentialRefused { .. } => Side::Policy,
            ProxyError::CredentialUnavailable { .. } => Side::Internal,
            ProxyError::ApprovalNotExecuted { status, .. } => {
                if *status == "failed" {
                    Side::Upstream
                } else {
                    Side::Policy
                }
            }
            ProxyError::Upstream { .. } | ProxyError::UpstreamTimeout { .. } => Side::Upstream,
            ProxyError::Internal { .. }
            | ProxyError::AuditUnavailable { .. }
            | ProxyError::StateUnavailable { .. } => Side::Internal,
            ProxyError::McpRefused { replies, .. } => {
                replies.first().map_or(Side::Policy, |r| r.error.side())
            }
        }
    }

    /// The audit decision this outcome records: a refusal is a deny, a failure an error.
    pub fn audit_decision(&self) -> &'static str {
        if matches!(self, ProxyError::ApprovalPending { .. }) {
            return "escalate";
        }
        match self.side() {
            Side::Agent | Side::Policy => "deny",
            Side::Upstream | Side::Internal => "error",
        }
    }

    /// Determining policies, when policy decided.
    pub fn policies(&self) -> &[String] {
        match self {
            ProxyError::Denied { policies, .. } | ProxyError::ApprovalRequired { policies, .. } => {
                policies
            }
            ProxyError::McpRefused { replies, .. } => {
                replies.first().map_or(&[], |r| r.error.policies())
            }
            _ => &[],
        }
    }

    pub(crate) fn bad_request(reason: impl Into<String>) -> Self {
        ProxyError::BadRequest {
            reason: reason.into(),
        }
    }

    pub(crate) fn unauthenticated(reason: impl Into<String>) -> Self {
        ProxyError::Unauthenticated {
            reason: reason.into(),
        }
    }
}
