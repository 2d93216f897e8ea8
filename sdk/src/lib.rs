//! Ostiary's Rust SDK: create and tear down sessions through the control API, and build the
//! environment a child process needs to send all its traffic through the proxy.
//!
//! The SDK depends on no other Ostiary crate: it speaks the wire contract of docs/design.md §5–§7.
//!
//! # Layout
//! One module; its items:
//! - [`ControlClient`] — the control API client: sessions, dead letters, approvals.
//! - [`NewSession`] — what to ask for when creating a session (`POST /v1/sessions`).
//! - [`Session`] — a created session, and [`Session::env`], the environment of a child process.
//! - [`CA_BUNDLE_VARS`] — the variables naming the CA bundle, one per kind of client.
//! - [`SdkError`] — why a control API call failed.
#![forbid(unsafe_code)]

use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

/// Why a control API call failed.
#[derive(Debug, thiserror::Error)]
pub enum SdkError {
    #[error("control API at {url}: {message}")]
    Transport { url: String, message: String },
    #[error("control API answered {status}: {message}")]
    Api { status: u16, message: String },
    #[error("control API answer does not parse: {0}")]
    Decode(String),
}

/// What to ask for when creating a session (`POST /v1/sessions`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewSession {
    pub agent: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Requests the session may have held for approval at once (the proxy's `[sessions]`
    /// default when absent; a child's at most its parent's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_pending_approvals: Option<u32>,
    /// The sandbox profile the session's agent runs under (`context.session.profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// A created session.
#[derive(Clone, Serialize, Deserialize)]
pub struct Session {
    pub session_id: String,
    pub agent: String,
    pub tenant: String,
    pub token: String,
    /// Seconds since the epoch.
    pub expires_at: i64,
    pub proxy_url: String,
    pub ca_pem: String,
    /// Placeholder variables for the credentials the session may use
    /// (`GITHUB_TOKEN=ostiary:github`): worthless outside the proxy, swapped for the secret
    /// only towards the credential's hosts.
    #[serde(default)]
    pub placeholders: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("session_id", &self.session_id)
            .field("agent", &self.agent)
            .field("tenant", &self.tenant)
            .field("token", &"***")
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Environment variables naming the CA bundle, for the clients that read each (docs/design.md §7).
pub const CA_BUNDLE_VARS: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
];

impl Session {
    /// The variables a child process needs: proxy URLs (both cases, as clients differ) with
    /// the token, and the CA bundle at `ca_path`. `NO_PROXY` is cleared so nothing bypasses.
    pub fn env(&self, ca_path: &Path) -> Vec<(String, String)> {
        let mut env = Vec::new();
        for name in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
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
}

/// Client of the control API.
#[derive(Debug, Clone)]
pub struct ControlClient {
    base: String,
    admin_token: String,
    http: Client<HttpConnector, Full<Bytes>>,
}

#[derive(Deserialize)]
struct Problem {
    #[serde(default)]
    error: String,
    #[serde(default)]
    message: String,
}

impl ControlClient {
    /// A client of the control API at `base` (`http://127.0.0.1:8081`).
    pub fn new(base: impl Into<String>, admin_token: impl Into<String>) -> Self {
        Self {
            base: base.into().trim_end_matches('/').to_owned(),
            admin_token: admin_token.into(),
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Create a session.
    pub async fn create_session(&self, new: &NewSession) -> Result<Session, SdkError> {
        let body = serde_json::to_vec(new).map_err(|e| SdkError::Decode(e.to_string()))?;
        let (status, bytes) = self.call(Method::POST, "/v1/sessions", body).await?;
        if status != StatusCode::CREATED {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| SdkError::Decode(e.to_string()))
    }

    /// Tear a session down. An already ended session is not an error.
    pub async fn delete_session(&self, session_id: &str) -> Result<(), SdkError> {
        let path = format!("/v1/sessions/{session_id}");
        let (status, bytes) = self.call(Method::DELETE, &path, Vec::new()).await?;
        match status {
            StatusCode::OK | StatusCode::NOT_FOUND => Ok(()),
            other => Err(api_error(other, &bytes)),
        }
    }

    /// Tear a session down saying why, with the report of the run it was made for (`run`:
    /// exit, limit, what was cleaned; sealed into the audit trail as a `run` record). An
    /// already ended session is not an error (and its report is not recorded).
    pub async fn end_run(
        &self,
        session_id: &str,
        reason: &str,
        run: Option<&serde_json::Value>,
    ) -> Result<(), SdkError> {
        let path = format!("/v1/sessions/{}/terminate", urlencode(session_id));
        let mut body = serde_json::json!({ "reason": reason });
        if let Some(run) = run {
            body["run"] = run.clone();
        }
        let bytes = serde_json::to_vec(&body).map_err(|e| SdkError::Decode(e.to_string()))?;
        let (status, answer) = self.call(Method::POST, &path, bytes).await?;
        match status {
            StatusCode::OK | StatusCode::NOT_FOUND => Ok(()),
            other => Err(api_error(other, &answer)),
        }
    }

    /// One session: `{"session_id", "agent", "tenant", "parent", "depth", "expires_at",
    /// "state", "paused", "usage", "limits"}`. An unknown id is an [`SdkError::Api`] 404.
    pub async fn session(&self, session_id: &str) -> Result<serde_json::Value, SdkError> {
        self.get_json(&format!("/v1/sessions/{}", urlencode(session_id)))
            .await
    }

    /// Resume a paused session. One that is not paused is refused with a 409 whose message
    /// says why.
    pub async fn resume_session(&self, session_id: &str) -> Result<(), SdkError> {
        let path = format!("/v1/sessions/{}/resume", urlencode(session_id));
        self.post_ok(&path).await
    }

    /// End a session now, with the same teardown as [`ControlClient::delete_session`];
    /// unlike it, an unknown id is an error (a human asked to end that one).
    pub async fn terminate_session(&self, session_id: &str) -> Result<(), SdkError> {
        let path = format!("/v1/sessions/{}/terminate", urlencode(session_id));
        self.post_ok(&path).await
    }

    /// Dead letters (what paused sessions were doing), all or one session's:
    /// `{"dead_letters": [{"id", "session", "kind", "reason", "at", "snapshot"}]}`.
    pub async fn dead_letters(&self, session: Option<&str>) -> Result<serde_json::Value, SdkError> {
        let path = match session {
            Some(s) => format!("/v1/dead-letters?session={}", urlencode(s)),
            None => "/v1/dead-letters".to_owned(),
        };
        self.get_json(&path).await
    }

    /// Approvals, newest first (`status`: `pending`, `approved`, `executed`, ...), with
    /// queue counts: `{"approvals": [...], "counts": {...}}`.
    pub async fn approvals(&self, status: Option<&str>) -> Result<serde_json::Value, SdkError> {
        let path = match status {
            Some(s) => format!("/v1/approvals?status={}", urlencode(s)),
            None => "/v1/approvals".to_owned(),
        };
        self.get_json(&path).await
    }

    /// One approval, whole, with its notification deliveries.
    pub async fn approval(&self, id: &str) -> Result<serde_json::Value, SdkError> {
        self.get_json(&format!("/v1/approvals/{}", urlencode(id)))
            .await
    }

    /// Approve (`approve = true`) or deny an approval as `approver`.
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        approver: &str,
        reason: Option<&str>,
    ) -> Result<serde_json::Value, SdkError> {
        let verb = if approve { "approve" } else { "deny" };
        let body = serde_json::json!({ "approver": approver, "reason": reason });
        let path = format!("/v1/approvals/{}/{verb}", urlencode(id));
        let (status, bytes) = self
            .call(Method::POST, &path, body.to_string().into_bytes())
            .await?;
        if status != StatusCode::OK {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| SdkError::Decode(e.to_string()))
    }

    /// A review-page link for `approver`.
    pub async fn approval_link(&self, id: &str, approver: &str) -> Result<String, SdkError> {
        let body = serde_json::json!({ "approver": approver });
        let path = format!("/v1/approvals/{}/link", urlencode(id));
        let (status, bytes) = self
            .call(Method::POST, &path, body.to_string().into_bytes())
            .await?;
        if status != StatusCode::OK {
            return Err(api_error(status, &bytes));
        }
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| SdkError::Decode(e.to_string()))?;
        value["url"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| SdkError::Decode("no url in the answer".into()))
    }

    async fn get_json(&self, path: &str) -> Result<serde_json::Value, SdkError> {
        let (status, bytes) = self.call(Method::GET, path, Vec::new()).await?;
        if status != StatusCode::OK {
            return Err(api_error(status, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| SdkError::Decode(e.to_string()))
    }

    /// A POST with nothing to say that must answer 200. The body is an empty object rather
    /// than empty, so a server that parses every POST body still accepts it.
    async fn post_ok(&self, path: &str) -> Result<(), SdkError> {
        let (status, bytes) = self.call(Method::POST, path, b"{}".to_vec()).await?;
        if status != StatusCode::OK {
            return Err(api_error(status, &bytes));
        }
        Ok(())
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, Bytes), SdkError> {
        let url = format!("{}{}", self.base, path);
        let transport = |message: String| SdkError::Transport {
            url: url.clone(),
            message,
        };
        let req = Request::builder()
            .method(method)
            .uri(&url)
            .header("authorization", format!("Bearer {}", self.admin_token))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| transport(e.to_string()))?;
        let response = self
            .http
            .request(req)
            .await
            .map_err(|e| transport(format!("{e} (is `ostiary serve` running?)")))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(e.to_string()))?
            .to_bytes();
        Ok((status, bytes))
    }
}

/// Percent-encode a path segment or query value (ids are plain, but the CLI passes what
/// a human typed).
fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn api_error(status: StatusCode, bytes: &[u8]) -> SdkError {
    // Some refusals carry only the error kind (`{"error":"not_found"}`): better than nothing.
    let message = serde_json::from_slice::<Problem>(bytes)
        .map(|p| {
            if p.message.is_empty() {
                p.error
            } else {
                p.message
            }
        })
        .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned());
    SdkError::Api {
        status: status.as_u16(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_carry_the_message_or_else_the_error_kind() {
        let message = |body: &[u8]| match api_error(StatusCode::CONFLICT, body) {
            SdkError::Api { message, .. } => message,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            message(br#"{"error":"conflict","message":"session s-1 is not paused"}"#),
            "session s-1 is not paused"
        );
        assert_eq!(message(br#"{"error":"not_found"}"#), "not_found");
        assert_eq!(message(b"plain text"), "plain text");
    }
}
