//! The audit trail through the control API (`GET /v1/audit`): [`AuditQuery`] says which
//! records, [`ControlClient::audit`] reads them, oldest first, as the JSON lines the API
//! answers with (one object per record; docs/audit.md names the fields).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::Value;

use crate::call::Call;
use crate::control::ControlClient;
use crate::errors::SdkError;

/// Which audit records to read: all of them unless narrowed.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    session: Option<String>,
    since: Option<String>,
    decision: Option<String>,
    limit: Option<usize>,
}

impl AuditQuery {
    /// Every record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only `session`'s records.
    pub fn session(mut self, session: impl Into<String>) -> Self {
        self.session = Some(session.into());
        self
    }

    /// Only records with this decision: `allow`, `deny`, `escalate`, `error`, ...
    pub fn decision(mut self, decision: impl Into<String>) -> Self {
        self.decision = Some(decision.into());
        self
    }

    /// Only records written at or after `at`.
    pub fn since(mut self, at: SystemTime) -> Self {
        // A time before the epoch is the epoch: nothing was recorded before it.
        let ms = at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        self.since = Some(ms.to_string());
        self
    }

    /// Only records written in the last `ago`.
    pub fn since_ago(self, ago: Duration) -> Self {
        let at = SystemTime::now().checked_sub(ago).unwrap_or(UNIX_EPOCH);
        self.since(at)
    }

    /// At most `limit` records.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }
}

impl ControlClient {
    /// The audit records `query` selects, oldest first.
    pub async fn audit(&self, query: &AuditQuery) -> Result<Vec<Value>, SdkError> {
        let call = Call::new(Method::GET, "/v1/audit".to_owned())
            .query("session", query.session.clone())
            .query("since", query.since.clone())
            .query("decision", query.decision.clone())
            .query("limit", query.limit.map(|n| n.to_string()));
        let answer = self.call(call).await?;
        let text = String::from_utf8_lossy(&answer.body);
        text.lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(n, line)| {
                serde_json::from_str(line).map_err(|e| {
                    SdkError::Decode(format!(
                        "line {} of the answer to {} is not JSON: {e}",
                        n + 1,
                        answer.what()
                    ))
                })
            })
            .collect()
    }
}
