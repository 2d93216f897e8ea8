//! [`ControlClient`]: the control API (docs/design.md §6) — sessions, child sessions and
//! teardown here; approvals in [`crate::approvals`], the audit trail in [`crate::audit`].
//!
//! Configured from `OSTIARY_CONTROL_URL` (default `http://127.0.0.1:8081`) and
//! `OSTIARY_ADMIN_TOKEN` unless given explicitly ([`ControlClient::from_env`],
//! [`ControlClient::builder`]). It never uses a proxy: the control API is never reachable
//! through Ostiary, and the environment of an Ostiary session points every other client at
//! the proxy.
//!
//! Every call goes through one path, [`crate::call`].

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use crate::call::{segment, Auth, Call};
use crate::errors::SdkError;
use crate::secret::Secret;
use crate::session::{NewSession, Session, SessionStatus};

/// Where the control API listens unless told otherwise (`[listen] control`).
pub const DEFAULT_CONTROL_URL: &str = "http://127.0.0.1:8081";
/// The variable naming the control API's URL.
pub const CONTROL_URL_ENV: &str = "OSTIARY_CONTROL_URL";
/// The variable holding the admin token (the same one `ostiary serve` and the CLI read).
pub const ADMIN_TOKEN_ENV: &str = "OSTIARY_ADMIN_TOKEN";

/// How long one control call may take unless the builder says otherwise: teardown waits
/// for requests in flight (`[sessions] grace`), and a store under strain answers slowly.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a URL that cannot be used a message quotes.
const QUOTE_LIMIT: usize = 200;

/// Client of the control API. Cheap to clone (the connection pool is shared); `Debug`
/// never shows the admin token.
#[derive(Clone)]
pub struct ControlClient {
    pub(crate) base: String,
    pub(crate) admin_token: Option<Secret>,
    pub(crate) http: reqwest::Client,
    /// Why this client cannot make any call (an unusable URL given to
    /// [`ControlClient::new`]), reported by each call instead of a panic at construction.
    pub(crate) unusable: Option<String>,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("url", &self.base)
            .field("admin_token", &self.admin_token)
            .finish_non_exhaustive()
    }
}

/// Builds a [`ControlClient`]: what is not given is read from the environment.
#[derive(Debug, Clone, Default)]
pub struct ControlClientBuilder {
    url: Option<String>,
    admin_token: Option<Secret>,
    timeout: Option<Duration>,
}

impl ControlClientBuilder {
    /// The control API's URL (`http://127.0.0.1:8081`), instead of `OSTIARY_CONTROL_URL`.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The admin token, instead of `OSTIARY_ADMIN_TOKEN`.
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.admin_token = Secret::new(token);
        self
    }

    /// How long one call may take (60 s unless set).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The client. Fails with [`SdkError::Config`] for a URL (given or from the
    /// environment) that is not `http(s)://host` or that carries credentials. No admin
    /// token is not an error here: a session creating its own child needs none.
    pub fn build(self) -> Result<ControlClient, SdkError> {
        let (url, source) = match self.url {
            Some(url) => (url, "the given URL"),
            None => match std::env::var(CONTROL_URL_ENV) {
                Ok(url) if !url.trim().is_empty() => (url, CONTROL_URL_ENV),
                _ => (DEFAULT_CONTROL_URL.to_owned(), "the default URL"),
            },
        };
        let base = control_url(&url, source)?;
        let admin_token = self
            .admin_token
            .or_else(|| std::env::var(ADMIN_TOKEN_ENV).ok().and_then(Secret::new));
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(self.timeout.unwrap_or(DEFAULT_TIMEOUT))
            .build()
            .map_err(|e| SdkError::Config(format!("the HTTP client cannot be built: {e}")))?;
        Ok(ControlClient {
            base,
            admin_token,
            http,
            unusable: None,
        })
    }
}

/// The URL without its trailing `/`, when it can be the control API's.
fn control_url(text: &str, source: &str) -> Result<String, SdkError> {
    let text = text.trim();
    let parsed = reqwest::Url::parse(text).ok();
    if let Some(url) = &parsed {
        if !url.username().is_empty() || url.password().is_some() {
            return Err(SdkError::Config(format!(
                "the control API URL ({source}) must not carry credentials: give the admin \
                 token apart, or set {ADMIN_TOKEN_ENV}"
            )));
        }
    }
    match parsed {
        Some(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
            Ok(text.trim_end_matches('/').to_owned())
        }
        _ => Err(SdkError::Config(format!(
            "the control API URL ({source}) must be http:// or https:// with a host, got {:?}",
            text.chars().take(QUOTE_LIMIT).collect::<String>()
        ))),
    }
}

impl ControlClient {
    /// A client of the control API at `base` (`http://127.0.0.1:8081`) with `admin_token`
    /// (an empty one is none), ignoring the environment. A `base` that cannot be the
    /// control API's is reported by every call as [`SdkError::Config`]; use
    /// [`ControlClient::builder`] to learn it at once.
    ///
    /// # Panics
    /// When no TLS backend can be initialised, as `reqwest::Client::new` does.
    pub fn new(base: impl Into<String>, admin_token: impl Into<String>) -> Self {
        let base = base.into();
        let admin_token = Secret::new(admin_token);
        let built = ControlClientBuilder {
            url: Some(base.clone()),
            admin_token: admin_token.clone(),
            timeout: None,
        }
        .build();
        match built {
            Ok(client) => client,
            Err(e) => Self {
                base: base.trim().trim_end_matches('/').to_owned(),
                admin_token,
                http: reqwest::Client::builder()
                    .no_proxy()
                    .build()
                    .expect("reqwest's default client builds, as `reqwest::Client::new` assumes"),
                unusable: Some(e.to_string()),
            },
        }
    }

    /// A builder: what it is not given comes from `OSTIARY_CONTROL_URL` and
    /// `OSTIARY_ADMIN_TOKEN`, then the default URL.
    pub fn builder() -> ControlClientBuilder {
        ControlClientBuilder::default()
    }

    /// A client configured from `OSTIARY_CONTROL_URL` (default `http://127.0.0.1:8081`) and
    /// `OSTIARY_ADMIN_TOKEN`.
    pub fn from_env() -> Result<Self, SdkError> {
        Self::builder().build()
    }

    /// The control API's URL, without a trailing `/`.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Whether the client holds an admin token.
    pub fn has_admin_token(&self) -> bool {
        self.admin_token.is_some()
    }

    /// Create a root session (admin token), or — with [`NewSession::parent`] — a child on a
    /// session's behalf. A root session needs an agent name.
    pub async fn create_session(&self, new: &NewSession) -> Result<Session, SdkError> {
        if new.agent.trim().is_empty() && new.parent.is_none() {
            return Err(SdkError::Config(
                "a root session needs an agent name".to_owned(),
            ));
        }
        if let Some(parent) = &new.parent {
            segment(parent, "the parent session's id")?;
        }
        let body = serde_json::to_value(new).map_err(|e| SdkError::Decode(e.to_string()))?;
        let call = Call::new(Method::POST, "/v1/sessions".to_owned()).body(body);
        self.call(call).await?.json()
    }

    /// Create a child of `parent` with the parent's own token — the way an agent spawns a
    /// sub-agent, no admin token needed. It runs as the parent's agent unless `new.agent`
    /// names another that policy lets the parent spawn; its budgets are carved out of what
    /// the parent has left (asking for more is [`Refusal::LimitExceeded`](crate::Refusal::LimitExceeded)); it never
    /// outlives its parent.
    pub async fn create_child(
        &self,
        parent: &Session,
        new: &NewSession,
    ) -> Result<Session, SdkError> {
        let mut body = serde_json::to_value(new).map_err(|e| SdkError::Decode(e.to_string()))?;
        if let Some(object) = body.as_object_mut() {
            // The token says who the parent is; naming another would be refused anyway.
            object.remove("parent");
        }
        let mut call = Call::new(Method::POST, "/v1/sessions".to_owned()).body(body);
        call.auth = Auth::Session(&parent.token);
        self.call(call).await?.json()
    }

    /// Tear a session down (`DELETE /v1/sessions/{id}`): it and its descendants are refused
    /// from now on, their leases revoked and cached credentials dropped. An already ended
    /// session is not an error.
    pub async fn delete_session(&self, session_id: &str) -> Result<(), SdkError> {
        let path = format!("/v1/sessions/{}", segment(session_id, "a session id")?);
        match self.call(Call::new(Method::DELETE, path)).await {
            Err(SdkError::Api { status: 404, .. }) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Tear a session down saying why, with the report of the run it was made for (`run`:
    /// exit, limit, what was cleaned; sealed into the audit trail as a `run` record). An
    /// already ended session is not an error (and its report is not recorded).
    pub async fn end_run(
        &self,
        session_id: &str,
        reason: &str,
        run: Option<&Value>,
    ) -> Result<(), SdkError> {
        let path = format!(
            "/v1/sessions/{}/terminate",
            segment(session_id, "a session id")?
        );
        let mut body = serde_json::json!({ "reason": reason });
        if let Some(run) = run {
            body["run"] = run.clone();
        }
        match self.call(Call::new(Method::POST, path).body(body)).await {
            Err(SdkError::Api { status: 404, .. }) => Ok(()),
            other => other.map(drop),
        }
    }

    /// One session as JSON: `{"session_id", "agent", "tenant", "parent", "depth",
    /// "expires_at", "state", "paused", "usage", "limits", "children"}`. An unknown id is
    /// an [`SdkError::Api`] 404 ([`Refusal::NotFound`](crate::Refusal::NotFound)). [`ControlClient::session_status`]
    /// reads the same answer into a [`SessionStatus`].
    pub async fn session(&self, session_id: &str) -> Result<Value, SdkError> {
        let path = format!("/v1/sessions/{}", segment(session_id, "a session id")?);
        self.call(Call::new(Method::GET, path)).await?.json()
    }

    /// One session's state, usage, limits and children.
    pub async fn session_status(&self, session_id: &str) -> Result<SessionStatus, SdkError> {
        let path = format!("/v1/sessions/{}", segment(session_id, "a session id")?);
        self.call(Call::new(Method::GET, path)).await?.json()
    }

    /// Resume a paused session. One that is not paused is refused with a 409
    /// ([`Refusal::Conflict`](crate::Refusal::Conflict)) whose message says why.
    pub async fn resume_session(&self, session_id: &str) -> Result<(), SdkError> {
        let path = format!(
            "/v1/sessions/{}/resume",
            segment(session_id, "a session id")?
        );
        self.post_empty(path).await
    }

    /// End a session now, with the same teardown as [`ControlClient::delete_session`];
    /// unlike it, an unknown id is an error (a human asked to end that one).
    pub async fn terminate_session(&self, session_id: &str) -> Result<(), SdkError> {
        let path = format!(
            "/v1/sessions/{}/terminate",
            segment(session_id, "a session id")?
        );
        self.post_empty(path).await
    }

    /// Send a session's recorded undos, newest first (`POST /v1/sessions/{id}/undo`): the
    /// report of what was reversed, failed, refused, unavailable and had no undo. `since`
    /// is epoch milliseconds, RFC 3339 or a duration back from now; `dry_run` decides each
    /// and sends nothing.
    pub async fn undo_session(
        &self,
        session_id: &str,
        since: Option<&str>,
        dry_run: bool,
    ) -> Result<Value, SdkError> {
        let path = format!("/v1/sessions/{}/undo", segment(session_id, "a session id")?);
        let mut body = serde_json::json!({ "dry_run": dry_run });
        if let Some(since) = since {
            body["since"] = serde_json::json!(since);
        }
        self.call(Call::new(Method::POST, path).body(body))
            .await?
            .json()
    }

    /// Dead letters (what paused sessions were doing), all or one session's:
    /// `{"dead_letters": [{"id", "session", "kind", "reason", "at", "snapshot"}]}`.
    pub async fn dead_letters(&self, session: Option<&str>) -> Result<Value, SdkError> {
        let call = Call::new(Method::GET, "/v1/dead-letters".to_owned())
            .query("session", session.map(str::to_owned));
        self.call(call).await?.json()
    }

    /// The policy sets that were live, the most recently gone live first: `{"current",
    /// "versions": [{"version", "current", "live", "first_live_ms", "last_live_ms",
    /// "replaced_ms", "policies", "tools"}]}` (`current`: the set this replica serves).
    pub async fn policy_versions(&self, limit: Option<u32>) -> Result<Value, SdkError> {
        let call = Call::new(Method::GET, "/v1/policy/versions".to_owned())
            .query("limit", limit.map(|n| n.to_string()));
        self.call(call).await?.json()
    }

    /// Make the shadow set (`[policy] shadow_dir`) the enforced one: `{"status": "promoted",
    /// "version", "replaced", "policies", "generation"}`.
    pub async fn promote_policy(&self) -> Result<Value, SdkError> {
        let call = Call::new(Method::POST, "/v1/policy/promote".to_owned());
        self.call(call).await?.json()
    }

    /// Start a run of an `api` trigger with `payload`: `{"run_id", "trigger", "status",
    /// "duplicate", "status_url"}` (a duplicate of an earlier call, by the trigger's
    /// deduplication key, answers the first run's id).
    pub async fn start_run(&self, trigger: &str, payload: Value) -> Result<Value, SdkError> {
        let call = Call::new(Method::POST, "/v1/runs".to_owned())
            .body(serde_json::json!({"trigger": trigger, "payload": payload}));
        self.call(call).await?.json()
    }

    /// Runs, newest first: `{"runs": [...]}`, filtered by status, trigger, dead letters.
    pub async fn runs(
        &self,
        status: Option<&str>,
        trigger: Option<&str>,
        dead_letters: bool,
        limit: Option<u32>,
    ) -> Result<Value, SdkError> {
        let call = Call::new(Method::GET, "/v1/runs".to_owned())
            .query("status", status.map(str::to_owned))
            .query("trigger", trigger.map(str::to_owned))
            .query("dead_letters", dead_letters.then(|| "1".to_owned()))
            .query("limit", limit.map(|n| n.to_string()));
        self.call(call).await?.json()
    }

    /// One run: its trigger, status, attempts, session, exit, limit, cost, dead letter.
    pub async fn run(&self, run_id: &str) -> Result<Value, SdkError> {
        let path = format!("/v1/runs/{}", segment(run_id, "a run id")?);
        self.call(Call::new(Method::GET, path)).await?.json()
    }

    /// Cancel a run: at once if it has not started, else it is stopped and ends
    /// `cancelled`. One that has ended is a 409.
    pub async fn cancel_run(&self, run_id: &str) -> Result<Value, SdkError> {
        let path = format!("/v1/runs/{}/cancel", segment(run_id, "a run id")?);
        let call = Call::new(Method::POST, path).body(serde_json::json!({}));
        self.call(call).await?.json()
    }

    /// Queue a run that ended (failed, dead-lettered, cancelled) again.
    pub async fn retry_run(&self, run_id: &str) -> Result<Value, SdkError> {
        let path = format!("/v1/runs/{}/retry", segment(run_id, "a run id")?);
        let call = Call::new(Method::POST, path).body(serde_json::json!({}));
        self.call(call).await?.json()
    }

    /// A POST with nothing to say. The body is an empty object rather than empty, so a
    /// server that parses every POST body still accepts it.
    async fn post_empty(&self, path: String) -> Result<(), SdkError> {
        let call = Call::new(Method::POST, path).body(serde_json::json!({}));
        self.call(call).await.map(drop)
    }
}
