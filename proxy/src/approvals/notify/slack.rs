//! Posting approval notices to a Slack incoming webhook.
//!
//! The webhook URL is a bearer credential (whoever has it can post to the channel), so it
//! never appears in `Debug`, errors or logs. The client ignores `HTTP_PROXY`/`HTTPS_PROXY`:
//! Ostiary is itself an HTTP proxy and its environment may point at itself or at a proxy
//! the operator meant for agents, not for Ostiary's own notifications.

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use super::message::NotifyError;

/// How long one post may take, connecting included; the notifier retries after it.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One incoming webhook.
#[derive(Clone)]
pub struct SlackWebhook {
    url: reqwest::Url,
    client: reqwest::Client,
}

impl fmt::Debug for SlackWebhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlackWebhook").field("url", &"***").finish()
    }
}

impl SlackWebhook {
    /// Checks the URL now, so a typo shows at start-up rather than at the first approval.
    pub fn new(url: &str) -> Result<Self, NotifyError> {
        // url::ParseError's message never quotes the input, so the secret stays out of it.
        let url = reqwest::Url::parse(url.trim())
            .map_err(|e| NotifyError::Config(format!("Slack webhook URL does not parse: {e}")))?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(NotifyError::Config(format!(
                "Slack webhook URL must be http(s), not {}",
                url.scheme()
            )));
        }
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .build()
            .map_err(|e| NotifyError::SlackTransport(e.without_url()))?;
        Ok(Self { url, client })
    }

    /// Posts one Block Kit payload. Slack answers 200 `ok`; anything else is an error with
    /// the status, retried by the caller.
    pub async fn send(&self, payload: &Value) -> Result<(), NotifyError> {
        let response = self
            .client
            .post(self.url.clone())
            .json(payload)
            .send()
            .await
            .map_err(|e| NotifyError::SlackTransport(e.without_url()))?;
        let status = response.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(NotifyError::SlackStatus {
                status: status.as_u16(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const SECRET_URL_PART: &str = "T000/B000/SeCrEtWeBhOoK";

    #[test]
    fn debug_hides_the_url() {
        let hook = SlackWebhook::new(&format!(
            "https://hooks.example.test/services/{SECRET_URL_PART}"
        ))
        .unwrap();
        let shown = format!("{hook:?}");
        assert!(!shown.contains(SECRET_URL_PART), "{shown}");
        assert!(shown.contains("***"));
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_them() {
        let err = SlackWebhook::new("ftp://x/SeCrEt").unwrap_err();
        assert!(!err.to_string().contains("SeCrEt"), "{err}");
        let err = SlackWebhook::new("not a url SeCrEt").unwrap_err();
        assert!(!err.to_string().contains("SeCrEt"), "{err}");
    }

    /// A one-shot HTTP/1 server answering `status` to whatever arrives.
    async fn answer_once(status: &'static str) -> (String, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // Read until the JSON body has arrived (it ends with `}`).
            loop {
                let n = stream.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
                if n == 0 || seen.ends_with(b"}") {
                    break;
                }
            }
            let reply =
                format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
            stream.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&seen).into_owned()
        });
        (
            format!("http://127.0.0.1:{port}/services/{SECRET_URL_PART}"),
            task,
        )
    }

    #[tokio::test]
    async fn posts_json_and_accepts_200() {
        let (url, seen) = answer_once("200 OK").await;
        let hook = SlackWebhook::new(&url).unwrap();
        hook.send(&serde_json::json!({"text": "hi"})).await.unwrap();
        let seen = seen.await.unwrap();
        assert!(
            seen.starts_with(&format!("POST /services/{SECRET_URL_PART} HTTP/1.1")),
            "{seen}"
        );
        assert!(seen
            .to_ascii_lowercase()
            .contains("content-type: application/json"));
        assert!(seen.ends_with(r#"{"text":"hi"}"#));
    }

    #[tokio::test]
    async fn non_2xx_is_an_error_with_the_status_only() {
        let (url, _seen) = answer_once("500 Internal Server Error").await;
        let hook = SlackWebhook::new(&url).unwrap();
        let err = hook
            .send(&serde_json::json!({"text": "hi"}))
            .await
            .unwrap_err();
        assert!(
            matches!(err, NotifyError::SlackStatus { status: 500 }),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn transport_errors_do_not_carry_the_url() {
        // A port that was just free: connection refused.
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let hook = SlackWebhook::new(&format!(
            "http://127.0.0.1:{port}/services/{SECRET_URL_PART}"
        ))
        .unwrap();
        let err = hook.send(&serde_json::json!({})).await.unwrap_err();
        assert!(matches!(err, NotifyError::SlackTransport(_)), "{err:?}");
        let mut chain = format!("{err} {err:?}");
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            chain.push_str(&format!(" {s} {s:?}"));
            source = s.source();
        }
        assert!(!chain.contains(SECRET_URL_PART), "{chain}");
    }
}
