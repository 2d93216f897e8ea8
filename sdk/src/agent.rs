//! [`AgentClient`]: the agent's HTTP client — `reqwest` through the session's proxy,
//! trusting its CA — that turns Ostiary's refusals into [`SdkError`]s and hands back
//! everything the upstream answered untouched, whatever its status.
//!
//! Ostiary's own answers are told apart by `Ostiary-Request-Id`, which it sets on every
//! answer it produces and removes from every answer it forwards; only those are read (a
//! refusal's body is small), so an upstream's stream is never buffered. A refused MCP
//! `tools/call` is an HTTP 200 whose JSON-RPC error carries the refusal: that answer is read
//! too, and handed back rebuilt when it turns out not to be a refusal.
//!
//! For `https://` URLs a destination the proxy refuses outright is refused at `CONNECT`,
//! before any TLS, and `reqwest` keeps that answer's body: a `407` becomes
//! [`Refusal::Unauthenticated`] and any other refusal [`SdkError::TunnelRefused`], read from
//! the transport's error. Waiting for held requests is in [`crate::waiting`].

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::{IntoUrl, Method, RequestBuilder, Response, StatusCode, Version};
use serde_json::Value;

use crate::errors::SdkError;
use crate::refusal::{Problem, Refusal, REQUEST_ID_HEADER};
use crate::secret::{redact, Secret};
use crate::session::Session;

/// How long reaching the proxy may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest silence between two reads: above the longest `Prefer: wait` the SDK asks the
/// proxy to hold a retry open (60 s), so a wait for approval is not cut by it.
const READ_TIMEOUT: Duration = Duration::from_secs(90);
/// How much of a body that is not JSON a message quotes.
const QUOTE_LIMIT: usize = 200;

/// The agent's client: requests through the proxy as one session. Cheap to clone; `Debug`
/// never shows the token.
#[derive(Clone)]
pub struct AgentClient {
    pub(crate) http: reqwest::Client,
    pub(crate) token: Secret,
    pub(crate) session_id: String,
    /// `http://host:port` of the proxy, where the agent's window on the approval queue is.
    pub(crate) proxy_base: String,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("session_id", &self.session_id)
            .field("proxy", &self.proxy_base)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl AgentClient {
    /// A client for `session`: [`Session::client_builder`] with a 10 s connect timeout and
    /// a 90 s read timeout (no total timeout: bodies may stream for as long as they do).
    pub fn new(session: &Session) -> Result<Self, SdkError> {
        let http = session
            .client_builder()?
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| {
                SdkError::Config(format!(
                    "session {}: its client cannot be built: {}",
                    session.session_id,
                    chain(&e)
                ))
            })?;
        Self::with_http(session, http)
    }

    /// Wrap a client of your own, built from [`Session::client_builder`] (a client that
    /// does not go through this session's proxy gets nothing from the wrapping). Its read
    /// timeout should exceed 60 s for waits of that length.
    pub fn with_http(session: &Session, http: reqwest::Client) -> Result<Self, SdkError> {
        let bad = || {
            SdkError::Config(format!(
                "session {}: its proxy URL is not an http:// URL with a host and port",
                session.session_id
            ))
        };
        let proxy = reqwest::Url::parse(&session.proxy_url).map_err(|_| bad())?;
        let (Some(host), Some(port)) = (proxy.host_str(), proxy.port_or_known_default()) else {
            return Err(bad());
        };
        if proxy.scheme() != "http" {
            return Err(bad());
        }
        let token = Secret::new(session.token.as_str()).ok_or_else(|| {
            SdkError::Config(format!("session {} has no token", session.session_id))
        })?;
        Ok(Self {
            http,
            token,
            session_id: session.session_id.clone(),
            proxy_base: format!("http://{host}:{port}"),
        })
    }

    /// The `reqwest` client underneath, for requests whose answers the caller reads raw.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The session this client sends as.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// A request to build and [`AgentClient::send`].
    pub fn request(&self, method: Method, url: impl IntoUrl) -> RequestBuilder {
        self.http.request(method, url)
    }

    /// A `GET` to build and send.
    pub fn get(&self, url: impl IntoUrl) -> RequestBuilder {
        self.http.get(url)
    }

    /// A `POST` to build and send.
    pub fn post(&self, url: impl IntoUrl) -> RequestBuilder {
        self.http.post(url)
    }

    /// A `PUT` to build and send.
    pub fn put(&self, url: impl IntoUrl) -> RequestBuilder {
        self.http.put(url)
    }

    /// A `DELETE` to build and send.
    pub fn delete(&self, url: impl IntoUrl) -> RequestBuilder {
        self.http.delete(url)
    }

    /// Send `request`: the upstream's answer as it came (a `403` of its own included), or
    /// Ostiary's refusal as [`SdkError::Refused`] — a held request is
    /// [`Refusal::ApprovalPending`], to wait for with [`AgentClient::wait_for_approval`]
    /// (or send it with [`AgentClient::send_waiting`] instead). A 2xx JSON answer of
    /// Ostiary's own (an approval's status view, an MCP answer that is not a refusal) had
    /// to be read to tell, and is handed back rebuilt: its `url()` is reqwest's placeholder.
    pub async fn send(&self, request: RequestBuilder) -> Result<Response, SdkError> {
        let (http, request) = request.build_split();
        let request = request
            .map_err(|e| SdkError::Config(format!("the request cannot be built: {}", chain(&e))))?;
        let url = request.url().clone();
        match http.execute(request).await {
            Ok(response) => check(response, &[self.token.expose()]).await,
            Err(e) => Err(self.unsent(&url, &e)),
        }
    }

    /// The error for a request that got no answer: a refusal at `CONNECT` when the
    /// transport says so, else [`SdkError::Transport`].
    fn unsent(&self, url: &reqwest::Url, e: &reqwest::Error) -> SdkError {
        let text = chain(e);
        let host = match (url.host_str(), url.port_or_known_default()) {
            (Some(host), Some(port)) => format!("{host}:{port}"),
            (Some(host), None) => host.to_owned(),
            _ => url.to_string(),
        };
        // hyper-util's tunnel errors are not public types: their wording is what there is.
        if text.contains("proxy authorization required") {
            let message = format!(
                "the proxy refused the session token when opening the tunnel to {host} (the \
                 session may have ended, expired or never existed)"
            );
            let problem = Problem::worded(407, "unauthenticated", message);
            return SdkError::Refused(Box::new(Refusal::Unauthenticated(problem)));
        }
        if text.contains("tunnel error: unsuccessful") {
            return SdkError::TunnelRefused { host };
        }
        // With a proxy set, every connection the client opens is to the proxy.
        let hint = if e.is_connect() {
            format!(" (is the proxy at {} running?)", self.proxy_base)
        } else {
            String::new()
        };
        SdkError::Transport {
            url: redact(url.as_str(), [self.token.expose()]),
            message: redact(&format!("{text}{hint}"), [self.token.expose()]),
        }
    }
}

/// The response, or the refusal it stands for when Ostiary produced it.
pub(crate) async fn check(response: Response, secrets: &[&str]) -> Result<Response, SdkError> {
    let Some(request_id) = response
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
    else {
        return Ok(response);
    };
    let status = response.status();
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let is_json = content_type.contains("json");
    let read = status.is_client_error()
        || status.is_server_error()
        || status == StatusCode::ACCEPTED
        || (status.is_success() && is_json);
    if !read {
        return Ok(response);
    }
    let (version, headers, url) = (
        response.version(),
        response.headers().clone(),
        response.url().to_string(),
    );
    let body = response.bytes().await.map_err(|e| SdkError::Transport {
        url: redact(&url, secrets.iter().copied()),
        message: redact(&chain(&e), secrets.iter().copied()),
    })?;
    let json = serde_json::from_slice::<Value>(&body).ok();
    let id = Some(request_id.as_str());
    if status.is_success() {
        let refusal = json.as_ref().and_then(|v| {
            let held = (status == StatusCode::ACCEPTED)
                .then(|| Refusal::from_body(Some(status.as_u16()), v, id))
                .flatten()
                .filter(|r| matches!(r, Refusal::ApprovalPending(_)));
            held.or_else(|| Refusal::from_jsonrpc(v, id))
        });
        return match refusal {
            Some(refusal) => Err(SdkError::Refused(Box::new(refusal))),
            None => Ok(rebuild(status, version, headers, body)),
        };
    }
    match json
        .as_ref()
        .and_then(|v| Refusal::from_body(Some(status.as_u16()), v, id))
    {
        Some(refusal) => Err(SdkError::Refused(Box::new(refusal))),
        None => {
            let text = String::from_utf8_lossy(&body);
            let quoted = redact(
                &text.chars().take(QUOTE_LIMIT).collect::<String>(),
                secrets.iter().copied(),
            );
            let kind = if content_type.is_empty() {
                "no content type"
            } else {
                content_type.as_str()
            };
            Err(SdkError::Decode(format!(
                "Ostiary answered HTTP {status} with a body that is not its JSON ({kind}): \
                 {quoted:?} [request {request_id}]"
            )))
        }
    }
}

/// A response whose body was read, whole again. Its `url()` is reqwest's placeholder: the
/// type keeps the original's private.
pub(crate) fn rebuild(
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = headers;
    Response::from(response)
}

/// An error and its causes, as one line: reqwest's own message names only the outermost.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}
