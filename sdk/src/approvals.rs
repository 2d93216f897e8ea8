//! The approvers' side of the queue on the control API: list ([`ApprovalQuery`]), show,
//! approve and deny held requests, and make a review link. The agent's side — waiting for
//! the outcome — is [`crate::AgentClient::wait_for_approval`].

use std::fmt;

use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use crate::call::{segment, Call};
use crate::control::ControlClient;
use crate::errors::SdkError;

/// Where an approval is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize)]
#[serde(from = "String")]
#[non_exhaustive]
pub enum ApprovalStatus {
    /// Waiting for a human.
    Pending,
    /// A human said yes; not yet claimed for execution.
    Approved,
    /// The upstream call may be under way.
    Executing,
    /// Executed once; the upstream's response is stored.
    Executed,
    /// Approved, but the execution reached no response; not retried (whether it took
    /// effect is unknown).
    Failed,
    /// Approved, but re-authorization at execution refused it; nothing was sent.
    Refused,
    /// A human said no.
    Denied,
    /// The deadline passed undecided.
    Expired,
    /// A state this SDK does not know (yet).
    Other(String),
}

impl ApprovalStatus {
    /// The API's spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Executing => "executing",
            Self::Executed => "executed",
            Self::Failed => "failed",
            Self::Refused => "refused",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Other(other) => other,
        }
    }

    /// Whether nothing will change any more.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::Executed | Self::Failed | Self::Refused | Self::Denied | Self::Expired
        )
    }
}

impl From<String> for ApprovalStatus {
    fn from(text: String) -> Self {
        match text.as_str() {
            "pending" => Self::Pending,
            "approved" => Self::Approved,
            "executing" => Self::Executing,
            "executed" => Self::Executed,
            "failed" => Self::Failed,
            "refused" => Self::Refused,
            "denied" => Self::Denied,
            "expired" => Self::Expired,
            _ => Self::Other(text),
        }
    }
}

impl fmt::Display for ApprovalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One approval as the queue lists it (and as approving or denying answers): enough to
/// pick one and decide it. [`ControlClient::approval`] shows everything.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct Approval {
    /// Its id (`apr_…`).
    pub approval_id: String,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// One line saying what will happen.
    #[serde(default)]
    pub summary: Option<String>,
    /// The catalog tool, for a tool call.
    #[serde(default)]
    pub tool: Option<String>,
    /// The agent that asked.
    #[serde(default)]
    pub agent: Option<String>,
    /// The session that asked.
    #[serde(default)]
    pub session: Option<String>,
    /// Who decided, once someone did.
    #[serde(default)]
    pub approver: Option<String>,
    /// When it was held (ms since the epoch).
    #[serde(default)]
    pub created_ms: Option<i64>,
    /// When it expires undecided (ms since the epoch).
    #[serde(default)]
    pub deadline_ms: Option<i64>,
}

/// Which approvals to list: every state unless [`ApprovalQuery::status`] narrows it.
#[derive(Debug, Clone, Default)]
pub struct ApprovalQuery {
    status: Option<ApprovalStatus>,
    session: Option<String>,
    limit: Option<usize>,
}

impl ApprovalQuery {
    /// Every approval (newest first, up to the API's limit of 100).
    pub fn new() -> Self {
        Self::default()
    }

    /// The pending ones: what waits for a human.
    pub fn pending() -> Self {
        Self::new().status(ApprovalStatus::Pending)
    }

    /// Only those in `status`.
    pub fn status(mut self, status: ApprovalStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only those `session` asked for.
    pub fn session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// At most `limit` (1 to 10,000).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }
}

#[derive(Deserialize)]
struct Listed {
    approvals: Vec<Approval>,
}

impl ControlClient {
    /// Approvals as the API answers, newest first (`status`: `pending`, `approved`,
    /// `executed`, ...), with queue counts: `{"approvals": [...], "counts": {...}}`.
    /// [`ControlClient::list_approvals`] reads them typed.
    pub async fn approvals(&self, status: Option<&str>) -> Result<Value, SdkError> {
        let call = Call::new(Method::GET, "/v1/approvals".to_owned())
            .query("status", status.map(str::to_owned));
        self.call(call).await?.json()
    }

    /// The approvals `query` selects, newest first.
    pub async fn list_approvals(&self, query: &ApprovalQuery) -> Result<Vec<Approval>, SdkError> {
        let call = Call::new(Method::GET, "/v1/approvals".to_owned())
            .query(
                "status",
                query.status.as_ref().map(|s| s.as_str().to_owned()),
            )
            .query("session", query.session.clone())
            .query("limit", query.limit.map(|n| n.to_string()));
        Ok(self.call(call).await?.json::<Listed>()?.approvals)
    }

    /// One approval, whole: what was observed, the held request (without the agent's
    /// credentials), the deciding policies, its notifications' deliveries.
    pub async fn approval(&self, id: &str) -> Result<Value, SdkError> {
        let path = format!("/v1/approvals/{}", segment(id, "an approval id")?);
        self.call(Call::new(Method::GET, path)).await?.json()
    }

    /// Approve (`approve = true`) or deny an approval as `approver`, answered as JSON.
    /// [`ControlClient::approve`] and [`ControlClient::deny`] read the answer typed.
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        approver: &str,
        reason: Option<&str>,
    ) -> Result<Value, SdkError> {
        if approver.trim().is_empty() {
            return Err(SdkError::Config(
                "deciding an approval needs the approver's name".to_owned(),
            ));
        }
        let verb = if approve { "approve" } else { "deny" };
        let path = format!("/v1/approvals/{}/{verb}", segment(id, "an approval id")?);
        let mut body = serde_json::json!({ "approver": approver });
        if let Some(reason) = reason {
            body["reason"] = Value::from(reason);
        }
        self.call(Call::new(Method::POST, path).body(body))
            .await?
            .json()
    }

    /// Approve as `approver`: the held request then runs exactly once. An approval already
    /// decided is refused ([`crate::Refusal::Conflict`]), as is an approver the queue does
    /// not accept ([`crate::Refusal::Denied`], kind `not_an_approver`).
    pub async fn approve(
        &self,
        id: &str,
        approver: &str,
        reason: Option<&str>,
    ) -> Result<Approval, SdkError> {
        let answer = self.decide(id, true, approver, reason).await?;
        typed(answer)
    }

    /// Deny as `approver`: the held request never runs, and the agent's wait ends with
    /// [`crate::Refusal::ApprovalDenied`].
    pub async fn deny(
        &self,
        id: &str,
        approver: &str,
        reason: Option<&str>,
    ) -> Result<Approval, SdkError> {
        let answer = self.decide(id, false, approver, reason).await?;
        typed(answer)
    }

    /// A review-page link for `approver` (signed, single-use, bound to them).
    pub async fn approval_link(&self, id: &str, approver: &str) -> Result<String, SdkError> {
        if approver.trim().is_empty() {
            return Err(SdkError::Config(
                "a review link needs the approver's name".to_owned(),
            ));
        }
        let path = format!("/v1/approvals/{}/link", segment(id, "an approval id")?);
        let body = serde_json::json!({ "approver": approver });
        let answer = self.call(Call::new(Method::POST, path).body(body)).await?;
        let value: Value = answer.json()?;
        value["url"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| SdkError::Decode(format!("the answer to {} has no url", answer.what())))
    }
}

fn typed(answer: Value) -> Result<Approval, SdkError> {
    serde_json::from_value(answer)
        .map_err(|e| SdkError::Decode(format!("an approval the SDK cannot read: {e}")))
}
