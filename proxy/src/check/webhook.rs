//! The `webhook` check: an external service asked about an action — an LLM guard, a
//! company's own rules. It receives a JSON description of what the proxy observed and
//! answers `{"decision": "allow" | "deny" | "escalate", "reason": "..."}` within what is
//! left of the tier's budget; the caller cancels it when the budget runs out.
//!
//! Its own HTTP client ignores `HTTP(S)_PROXY` (Ostiary is the proxy) and is never routed
//! through the agent-facing egress guard: the webhook is configured by the operator.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::config::WebhookCheck;
use crate::state::SecretString;

/// Why the webhook gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook client: {0}")]
    Client(#[source] reqwest::Error),
    /// Unreachable, reset, or not answering: the URL is left out (it may carry a token).
    #[error("webhook unreachable: {0}")]
    Transport(#[source] reqwest::Error),
    #[error("webhook answered HTTP {0}")]
    Status(u16),
    #[error("webhook answer is not {{\"decision\": allow|deny|escalate}}: {0}")]
    Answer(#[source] reqwest::Error),
}

/// What the webhook decided.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Deny,
    Escalate,
}

#[derive(Debug, Deserialize)]
pub struct Answer {
    pub decision: Decision,
    #[serde(default)]
    pub reason: Option<String>,
}

/// The configured external check.
#[derive(Debug)]
pub struct Webhook {
    url: String,
    token: Option<SecretString>,
    client: reqwest::Client,
}

impl Webhook {
    pub fn new(config: &WebhookCheck) -> Result<Self, WebhookError> {
        let token = config
            .token_env
            .as_ref()
            .and_then(|name| std::env::var(name).ok())
            .filter(|t| !t.is_empty())
            .map(SecretString::new);
        let client = reqwest::Client::builder()
            .no_proxy()
            // Per request the budget decides; this only bounds a connection's setup.
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(WebhookError::Client)?;
        Ok(Self {
            url: config.url.clone(),
            token,
            client,
        })
    }

    /// Ask about `action` (the JSON description); the caller bounds the wait.
    pub async fn ask(&self, action: &Value) -> Result<Answer, WebhookError> {
        let mut req = self.client.post(&self.url).json(action);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token.expose());
        }
        let response = req
            .send()
            .await
            .map_err(|e| WebhookError::Transport(e.without_url()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(WebhookError::Status(status.as_u16()));
        }
        response
            .json::<Answer>()
            .await
            .map_err(|e| WebhookError::Answer(e.without_url()))
    }
}
