//! One control API call, the one path every [`ControlClient`] method takes: described
//! ([`Call`]: method, path, query, body, which token), checked before sending (a client that
//! cannot call, no admin token, an empty id), sent, and read once — a 2xx is an [`Answer`],
//! a refusal [`SdkError::Api`] with its typed [`Refusal`], no answer [`SdkError::Transport`].
//! Messages quote only what Ostiary said, with the tokens replaced by `***`.

use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::control::{ControlClient, ADMIN_TOKEN_ENV};
use crate::errors::SdkError;
use crate::refusal::{Refusal, REQUEST_ID_HEADER};
use crate::secret::{redact, Secret};

/// How much of a body that is not JSON a message quotes.
const QUOTE_LIMIT: usize = 200;

/// Which token a call carries.
#[derive(Clone, Copy)]
pub(crate) enum Auth<'a> {
    /// The admin token; the call is refused before sending without one.
    Admin,
    /// A session's own token (creating its child).
    Session(&'a str),
}

/// One control call, described apart from how it is sent.
pub(crate) struct Call<'a> {
    pub method: Method,
    pub path: String,
    pub query: Vec<(&'static str, String)>,
    pub body: Option<Value>,
    pub auth: Auth<'a>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(method: Method, path: String) -> Self {
        Self {
            method,
            path,
            query: Vec::new(),
            body: None,
            auth: Auth::Admin,
        }
    }

    pub(crate) fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    pub(crate) fn query(mut self, name: &'static str, value: Option<String>) -> Self {
        if let Some(value) = value {
            self.query.push((name, value));
        }
        self
    }

    fn what(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// What the control API answered, once the status said yes.
pub(crate) struct Answer {
    pub body: bytes::Bytes,
    what: String,
}

impl Answer {
    pub(crate) fn json<T: DeserializeOwned>(&self) -> Result<T, SdkError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            SdkError::Decode(format!(
                "the answer to {} is not what the control API promises: {e}",
                self.what
            ))
        })
    }

    pub(crate) fn what(&self) -> &str {
        &self.what
    }
}

impl ControlClient {
    /// Send `call` and read the answer: `Ok` for any 2xx, [`SdkError::Api`] for a refusal.
    pub(crate) async fn call(&self, call: Call<'_>) -> Result<Answer, SdkError> {
        if let Some(why) = &self.unusable {
            return Err(SdkError::Config(why.clone()));
        }
        let token = match call.auth {
            Auth::Admin => self
                .admin_token
                .as_ref()
                .map(Secret::expose)
                .ok_or_else(|| {
                    SdkError::Config(format!(
                        "{} needs the admin token: give it to the client or set {ADMIN_TOKEN_ENV}",
                        call.what()
                    ))
                })?,
            Auth::Session(token) => token,
        };
        let secrets = [token, self.admin_token.as_ref().map_or("", Secret::expose)];
        let url = format!("{}{}", self.base, call.path);
        let mut request = self
            .http
            .request(call.method.clone(), &url)
            .bearer_auth(token)
            .header(reqwest::header::ACCEPT, "application/json");
        if !call.query.is_empty() {
            request = request.query(&call.query);
        }
        if let Some(body) = &call.body {
            request = request.json(body);
        }
        let unreachable = |e: reqwest::Error| {
            let hint = if e.is_connect() {
                " (is `ostiary serve` running?)"
            } else {
                ""
            };
            SdkError::Transport {
                url: url.clone(),
                message: redact(&format!("{}{hint}", crate::agent::chain(&e)), secrets),
            }
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let request_id = response
            .headers()
            .get(REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await.map_err(unreachable)?;
        if status.is_client_error() || status.is_server_error() {
            return Err(refused(status, &body, request_id.as_deref(), secrets));
        }
        Ok(Answer {
            body,
            what: call.what(),
        })
    }
}

/// The [`SdkError::Api`] for a refusal: the message is the body's sentence, else its error
/// kind (`{"error":"not_found"}` says more than nothing), else the body itself.
fn refused(
    status: StatusCode,
    body: &[u8],
    request_id: Option<&str>,
    secrets: [&str; 2],
) -> SdkError {
    let json = serde_json::from_slice::<Value>(body).ok();
    let refusal = json
        .as_ref()
        .and_then(|v| Refusal::from_body(Some(status.as_u16()), v, request_id));
    let said = |name: &str| {
        json.as_ref()
            .and_then(|v| v.get(name))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let message = said("message")
        .or_else(|| said("error"))
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            redact(&text.chars().take(QUOTE_LIMIT).collect::<String>(), secrets)
        });
    SdkError::Api {
        status: status.as_u16(),
        message,
        refusal: refusal.map(Box::new),
    }
}

/// `text` as one path segment, percent-encoded (ids are plain, but the CLI passes what a
/// human typed); an empty one is refused, since it would name another route.
pub(crate) fn segment(text: &str, what: &str) -> Result<String, SdkError> {
    if text.trim().is_empty() {
        return Err(SdkError::Config(format!("{what} must not be empty")));
    }
    Ok(text
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect())
}
