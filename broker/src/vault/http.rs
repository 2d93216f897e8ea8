//! One generic Vault API call on top of vaultrs's client, and the mapping of every failure
//! to a [`VaultError`].
//!
//! Why not vaultrs's own `api::exec_with_result` and friends: on an error response they log
//! Vault's error strings at ERROR level (`vaultrs::api`, "Detected errors in API response")
//! and warnings at WARN, and some Vault errors echo request data. Executing the rustify
//! endpoint ourselves keeps Vault's bodies out of every log line and every error, and
//! gives us the whole response envelope (`lease_id`, `lease_duration`, `auth`) that the
//! typed helpers strip off. vaultrs still holds the token, the middleware that adds it,
//! and the HTTP client with its timeout.

use rustify::endpoint::Endpoint;
use rustify::enums::{RequestMethod, RequestType, ResponseType};
use rustify::errors::ClientError as RestError;
use serde_json::Value;

use super::VaultError;

/// HTTP verbs the broker uses.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Method {
    Get,
    Post,
    Put,
}

/// A Vault API path, a verb and an optional JSON body; the answer is the raw envelope.
pub(crate) struct Call {
    pub path: String,
    pub method: Method,
    pub body: Option<Value>,
}

impl Endpoint for Call {
    type Response = Value;
    const REQUEST_BODY_TYPE: RequestType = RequestType::JSON;
    const RESPONSE_BODY_TYPE: ResponseType = ResponseType::JSON;

    fn path(&self) -> String {
        self.path.clone()
    }

    fn method(&self) -> RequestMethod {
        match self.method {
            Method::Get => RequestMethod::GET,
            Method::Post => RequestMethod::POST,
            Method::Put => RequestMethod::PUT,
        }
    }

    fn body(&self) -> Result<Option<Vec<u8>>, RestError> {
        match &self.body {
            None => Ok(None),
            Some(v) => serde_json::to_vec(v)
                .map(Some)
                .map_err(|e| RestError::DataParseError { source: e.into() }),
        }
    }
}

/// Execute one call with the client's token and return the JSON envelope (`Null` for an
/// empty 204 answer).
pub(crate) async fn call(
    client: &vaultrs::client::VaultClient,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, VaultError> {
    use vaultrs::client::Client as _;
    let endpoint = Call {
        path: path.to_string(),
        method,
        body,
    };
    let result = endpoint
        .with_middleware(client.middle())
        .exec(client.http())
        .await
        .map_err(|e| map_rest_error(path, e))?;
    let bytes = result.response.body();
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(bytes).map_err(|e| VaultError::Malformed {
        path: path.to_string(),
        // serde_json's message names a line and column, not content.
        reason: format!("response is not JSON: {e}"),
    })
}

/// Turn a rustify error into ours. Vault's error body is read only to recognise "sealed";
/// it is never copied into the error.
pub(crate) fn map_rest_error(path: &str, e: RestError) -> VaultError {
    match e {
        RestError::ServerResponseError { code, content } => {
            let sealed = content
                .as_deref()
                .is_some_and(|c| c.to_ascii_lowercase().contains("is sealed"));
            match code {
                503 if sealed => VaultError::Sealed,
                503 => VaultError::Unreachable(format!("{path} answered 503 (unavailable)")),
                401 | 403 => VaultError::Denied {
                    status: code,
                    path: path.to_string(),
                },
                404 => VaultError::NotFound(path.to_string()),
                500..=599 => VaultError::Malformed {
                    path: path.to_string(),
                    reason: format!("server error {code}"),
                },
                _ => VaultError::Malformed {
                    path: path.to_string(),
                    reason: format!("status {code}"),
                },
            }
        }
        // Sending failed (refused, reset, timed out) or the body did not arrive. The chain
        // names the URL and the cause; the token travels in a header and is not in it.
        RestError::RequestError { source, .. } | RestError::ResponseError { source } => {
            VaultError::Unreachable(format!("{path}: {source:#}"))
        }
        other => VaultError::Malformed {
            path: path.to_string(),
            reason: other.to_string(),
        },
    }
}

/// `data.<field>` of an envelope as a string.
pub(crate) fn str_field<'a>(v: &'a Value, path: &str, field: &str) -> Result<&'a str, VaultError> {
    v.get("data")
        .and_then(|d| d.get(field))
        .and_then(Value::as_str)
        .ok_or_else(|| VaultError::Malformed {
            path: path.to_string(),
            reason: format!("no string data.{field} in the response"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(code: u16, body: &str) -> VaultError {
        map_rest_error(
            "secret/data/x",
            RestError::ServerResponseError {
                code,
                content: Some(body.into()),
            },
        )
    }

    #[test]
    fn statuses_map_to_kinds_without_bodies() {
        assert!(matches!(
            answered(503, r#"{"errors":["Vault is sealed"]}"#),
            VaultError::Sealed
        ));
        assert!(matches!(
            answered(503, r#"{"errors":["standby"]}"#),
            VaultError::Unreachable(_)
        ));
        assert!(matches!(
            answered(403, r#"{"errors":["permission denied"]}"#),
            VaultError::Denied { status: 403, .. }
        ));
        assert!(matches!(answered(404, "{}"), VaultError::NotFound(_)));
        let e = answered(400, r#"{"errors":["bad input hunter2"]}"#);
        assert!(matches!(e, VaultError::Malformed { .. }));
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
