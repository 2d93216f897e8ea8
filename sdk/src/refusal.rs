//! Ostiary's refusals, read from the JSON it answers with (docs/design.md §5).
//!
//! Every answer Ostiary produces itself carries `Ostiary-Request-Id` and a body
//! `{"error": <kind>, "message": <sentence>, "request_id", ...details}`; a refused MCP
//! `tools/call` carries the same body as the `data` of a JSON-RPC error. [`Refusal`] is that
//! body by kind, each kind with its details as typed accessors, so an agent never learns the
//! shape by hand. Every reading is total: a detail of the wrong type reads as absent, an
//! unknown kind is [`Refusal::Other`] (it keeps its kind, so a newer proxy's refusals are
//! still refusals), and a body that is not Ostiary's is `None`, never a panic.

use std::fmt;

use serde_json::{Map, Value};

/// The header on every answer Ostiary produces itself (and on none it forwards).
pub const REQUEST_ID_HEADER: &str = "ostiary-request-id";

/// The header naming an approval: on the `202` that holds a request, and on the retry that
/// collects its outcome.
pub const APPROVAL_HEADER: &str = "ostiary-approval";

/// One of Ostiary's answers as its body says it: the fields every kind has, and the rest as
/// details.
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    status: Option<u16>,
    kind: String,
    message: String,
    request_id: Option<String>,
    details: Map<String, Value>,
}

impl Problem {
    /// The body read, when it is an object with a non-empty string `error`.
    fn read(status: Option<u16>, body: &Value, request_id: Option<&str>) -> Option<Self> {
        let object = body.as_object()?;
        let kind = object.get("error")?.as_str().filter(|k| !k.is_empty())?;
        let message = match object.get("message").and_then(Value::as_str) {
            Some(m) if !m.is_empty() => m.to_owned(),
            _ => format!("Ostiary refused the request ({kind})"),
        };
        // The body's own id first: a JSON-RPC batch answer has one header for many calls.
        let request_id = object
            .get("request_id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .or(request_id)
            .map(str::to_owned);
        let details = object
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "error" | "message" | "request_id"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(Self {
            status,
            kind: kind.to_owned(),
            message,
            request_id,
            details,
        })
    }

    /// A refusal the SDK words itself, from what the transport said (a `407` at `CONNECT`,
    /// whose body `reqwest` does not hand over).
    pub(crate) fn worded(status: u16, kind: &str, message: String) -> Self {
        Self {
            status: Some(status),
            kind: kind.to_owned(),
            message,
            request_id: None,
            details: Map::new(),
        }
    }

    /// The HTTP status it came with (`None` for one carried inside a JSON-RPC answer).
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// Ostiary's `error` field: `denied`, `limit_exceeded`, ...
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The human sentence (the SDK's own when the body had none).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The id to quote to an operator: it finds the audit record.
    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }

    /// Every other field of the body, as sent.
    pub fn details(&self) -> &Map<String, Value> {
        &self.details
    }

    /// The detail `name` when it is a string.
    pub fn detail(&self, name: &str) -> Option<&str> {
        self.details.get(name).and_then(Value::as_str)
    }

    /// The `reason` detail: what a refusal names as its cause, where it names one.
    pub fn reason(&self) -> Option<&str> {
        self.detail("reason")
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind)?;
        if let Some(status) = self.status {
            write!(f, " (HTTP {status})")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(id) = &self.request_id {
            write!(f, " [request {id}]")?;
        }
        Ok(())
    }
}

/// The accessors every typed refusal shares.
macro_rules! common {
    ($name:ident) => {
        impl $name {
            /// The answer whole: status, kind, message, request id, details.
            pub fn problem(&self) -> &Problem {
                &self.problem
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.problem.fmt(f)
            }
        }
    };
}

/// A policy said no (`403 denied`; also `approval_required`, `destination_blocked`,
/// `not_an_approver`, which [`Problem::kind`] tells apart).
#[derive(Debug, Clone, PartialEq)]
pub struct Denied {
    problem: Problem,
    policies: Vec<String>,
}
common!(Denied);

impl Denied {
    /// The ids (`@id` in the Cedar files) of the policies that decided it; empty for the
    /// default deny, where no policy permitted the request.
    pub fn policies(&self) -> &[String] {
        &self.policies
    }

    /// The Cedar action decided (`Ostiary::Action::"tool:github.create_issue"`).
    pub fn action(&self) -> Option<&str> {
        self.problem.detail("action")
    }

    /// The Cedar resource decided (`Ostiary::Tool::"github.create_issue"`).
    pub fn resource(&self) -> Option<&str> {
        self.problem.detail("resource")
    }

    /// The address refused, for `destination_blocked`.
    pub fn address(&self) -> Option<&str> {
        self.problem.detail("address")
    }
}

/// The request is held for a human (`202 approval_pending`; JSON-RPC `-32002`). Nothing was
/// sent upstream yet: wait for it with [`crate::AgentClient::wait_for_approval`], or
/// re-send the same request with [`crate::AgentClient::send_waiting`].
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalPending {
    problem: Problem,
}
common!(ApprovalPending);

impl ApprovalPending {
    /// The approval's id (`apr_…`), also in the `Ostiary-Approval` header.
    pub fn approval_id(&self) -> Option<&str> {
        self.problem.detail("approval_id")
    }

    /// Where the agent reads the approval's state (`GET`, on the proxy listener).
    pub fn status_url(&self) -> Option<&str> {
        self.problem.detail("status_url")
    }

    /// The hard deadline (RFC 3339): after it, the approval expires undecided.
    pub fn expires_at(&self) -> Option<&str> {
        self.problem.detail("expires_at")
    }

    /// Where the approval stands: `pending`, `approved` or `executing`.
    pub fn approval_status(&self) -> Option<&str> {
        self.problem.detail("status")
    }
}

/// A human denied the held request (`403 approval_denied`), or nobody decided before its
/// deadline (`approval_expired`, see [`ApprovalDenied::expired`]); it was not executed.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalDenied {
    problem: Problem,
}
common!(ApprovalDenied);

impl ApprovalDenied {
    /// The approval's id.
    pub fn approval_id(&self) -> Option<&str> {
        self.problem.detail("approval_id")
    }

    /// Who denied it (`None` when it expired).
    pub fn approver(&self) -> Option<&str> {
        self.problem.detail("approver")
    }

    /// The approver's reason, when they gave one.
    pub fn reason(&self) -> Option<&str> {
        self.problem.reason()
    }

    /// Whether it expired undecided rather than being denied.
    pub fn expired(&self) -> bool {
        self.problem.kind == "approval_expired"
    }
}

/// A budget, rate or bound is reached (`429 limit_exceeded`).
#[derive(Debug, Clone, PartialEq)]
pub struct LimitExceeded {
    problem: Problem,
    used: Option<f64>,
    max: Option<f64>,
    retry_after: Option<u64>,
}
common!(LimitExceeded);

impl LimitExceeded {
    /// Which limit: `calls`, `cost`, `bytes_sent`, `bytes_received`, `rate:agent`,
    /// `approvals`, `children`, `depth`, ...
    pub fn limit(&self) -> Option<&str> {
        self.problem.detail("limit")
    }

    /// How much was used, in the limit's unit.
    pub fn used(&self) -> Option<f64> {
        self.used
    }

    /// How much is allowed, in the limit's unit.
    pub fn max(&self) -> Option<f64> {
        self.max
    }

    /// Seconds until the limit reopens; `None` for a budget, which never refills by itself.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }
}

/// A check refused the request (`422 check_failed`).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckFailed {
    problem: Problem,
}
common!(CheckFailed);

impl CheckFailed {
    /// Which check: `args_schema`, `dlp`, `limits`, `webhook`.
    pub fn check(&self) -> Option<&str> {
        self.problem.detail("check")
    }

    /// What it found (never the secret a DLP check found).
    pub fn detail(&self) -> Option<&str> {
        self.problem.detail("detail")
    }
}

/// The broker could not fetch the credential this host needs (`503`: Vault down or
/// sealed, an entry missing). Nothing was sent upstream, so a retry is safe.
#[derive(Debug, Clone, PartialEq)]
pub struct CredentialUnavailable {
    problem: Problem,
}
common!(CredentialUnavailable);

impl CredentialUnavailable {
    /// The credential binding's name.
    pub fn credential(&self) -> Option<&str> {
        self.problem.detail("credential")
    }

    /// Why it could not be fetched.
    pub fn reason(&self) -> Option<&str> {
        self.problem.reason()
    }
}

/// One of Ostiary's refusals, by kind.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No, an invalid or an expired token: the session token at the proxy (`407`; a
    /// torn-down session's too), the admin token at the control API (`401`).
    #[error("{0}")]
    Unauthenticated(Problem),
    /// A request the proxy will not read (`bad_request`, `misdirected_request`; an
    /// `Ostiary-Approval` for another request or an unknown approval): see
    /// [`Problem::reason`].
    #[error("{0}")]
    BadRequest(Problem),
    /// A policy said no.
    #[error("{0}")]
    Denied(Denied),
    /// Held for a human.
    #[error("{0}")]
    ApprovalPending(ApprovalPending),
    /// A human said no, or nobody decided in time.
    #[error("{0}")]
    ApprovalDenied(ApprovalDenied),
    /// A budget, rate or bound is reached.
    #[error("{0}")]
    LimitExceeded(LimitExceeded),
    /// The watchdog paused the session (`423`): every request is refused until a human
    /// resumes or terminates it. [`Problem::reason`] says what tripped it.
    #[error("{0}")]
    SessionPaused(Problem),
    /// A check refused the request.
    #[error("{0}")]
    CheckFailed(CheckFailed),
    /// The credential for this host could not be fetched.
    #[error("{0}")]
    CredentialUnavailable(CredentialUnavailable),
    /// Ostiary cannot keep its promises right now (`audit_unavailable`,
    /// `state_unavailable`; the `component` detail says which): it refused rather than
    /// forward unaudited or uncounted.
    #[error("{0}")]
    Unavailable(Problem),
    /// The upstream failed or timed out (`upstream_error`, `upstream_timeout`), or an
    /// approved request could not be executed; whether it took effect is unknown.
    #[error("{0}")]
    Upstream(Problem),
    /// The control API has no such session or approval (`404 not_found`).
    #[error("{0}")]
    NotFound(Problem),
    /// The state a control call assumed is not the state there is (`not_pending`,
    /// `conflict`, `link_used`): an approval already decided, a session not paused.
    #[error("{0}")]
    Conflict(Problem),
    /// A kind this SDK does not know (yet): still a refusal, with its kind.
    #[error("{0}")]
    Other(Problem),
}

impl Refusal {
    /// The refusal one of Ostiary's JSON bodies stands for, or `None` when `body` is not
    /// one (not an object, or no string `error`). `request_id` is the header's, used when
    /// the body names none.
    pub fn from_body(status: Option<u16>, body: &Value, request_id: Option<&str>) -> Option<Self> {
        Problem::read(status, body, request_id).map(Self::of)
    }

    /// The refusal of a JSON-RPC error that Ostiary answered an MCP call with, or `None`
    /// when `message` is not one (a result, or another server's error without Ostiary's
    /// body as its `data`).
    pub fn from_jsonrpc(message: &Value, request_id: Option<&str>) -> Option<Self> {
        let data = message.get("error")?.as_object()?.get("data")?;
        Self::from_body(None, data, request_id)
    }

    fn of(problem: Problem) -> Self {
        match problem.kind.as_str() {
            "unauthenticated" => Self::Unauthenticated(problem),
            "bad_request" | "misdirected_request" => Self::BadRequest(problem),
            "denied" | "approval_required" | "destination_blocked" | "not_an_approver" => {
                let policies = match problem.details.get("policies") {
                    Some(Value::Array(list)) => list
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect(),
                    _ => Vec::new(),
                };
                Self::Denied(Denied { problem, policies })
            }
            "approval_pending" => Self::ApprovalPending(ApprovalPending { problem }),
            "approval_denied" | "approval_expired" => {
                Self::ApprovalDenied(ApprovalDenied { problem })
            }
            "limit_exceeded" => {
                let get = |name: &str| problem.details.get(name);
                Self::LimitExceeded(LimitExceeded {
                    used: get("used").and_then(Value::as_f64),
                    max: get("max").and_then(Value::as_f64),
                    retry_after: get("retry_after").and_then(whole),
                    problem,
                })
            }
            "session_paused" => Self::SessionPaused(problem),
            "check_failed" => Self::CheckFailed(CheckFailed { problem }),
            "credential_unavailable" => {
                Self::CredentialUnavailable(CredentialUnavailable { problem })
            }
            "audit_unavailable" | "state_unavailable" => Self::Unavailable(problem),
            "upstream_error" | "upstream_timeout" => Self::Upstream(problem),
            "not_found" => Self::NotFound(problem),
            "not_pending" | "conflict" | "link_used" => Self::Conflict(problem),
            _ => Self::Other(problem),
        }
    }

    /// The answer whole, whatever the kind.
    pub fn problem(&self) -> &Problem {
        match self {
            Self::Unauthenticated(p)
            | Self::BadRequest(p)
            | Self::SessionPaused(p)
            | Self::Unavailable(p)
            | Self::Upstream(p)
            | Self::NotFound(p)
            | Self::Conflict(p)
            | Self::Other(p) => p,
            Self::Denied(d) => d.problem(),
            Self::ApprovalPending(a) => a.problem(),
            Self::ApprovalDenied(a) => a.problem(),
            Self::LimitExceeded(l) => l.problem(),
            Self::CheckFailed(c) => c.problem(),
            Self::CredentialUnavailable(c) => c.problem(),
        }
    }

    /// Ostiary's `error` kind.
    pub fn kind(&self) -> &str {
        self.problem().kind()
    }

    /// The HTTP status it came with.
    pub fn status(&self) -> Option<u16> {
        self.problem().status()
    }

    /// The id that finds the audit record.
    pub fn request_id(&self) -> Option<&str> {
        self.problem().request_id()
    }
}

/// A count of seconds: a non-negative whole number (a JSON `true` is not one).
fn whole(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    })
}
