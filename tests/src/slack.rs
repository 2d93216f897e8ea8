//! Slack's two sides of the wire, for end-to-end tests: a receiver standing in for an
//! incoming webhook, and the signed interactive callbacks Slack would send back.
//!
//! The approval tests read the Block Kit message the proxy posted, follow its links and
//! press its buttons, and must never reach the real Slack. [`SlackReceiver`] is a plain
//! HTTP/1 server on `127.0.0.1:0` that keeps every JSON body posted to it and can be told
//! to fail ([`SlackReceiver::fail_next`]) to test retries. [`sign`] and
//! [`interaction_body`] build the `block_actions` callback and its `X-Slack-Signature`
//! exactly as Slack does, with an HMAC written here rather than borrowed from the proxy,
//! so a mistake in the proxy's verifier cannot be mirrored by the test.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

#[derive(Debug, Default)]
struct Shared {
    messages: Mutex<Vec<Value>>,
    arrived: Notify,
    /// Requests still to be answered 500.
    failing: AtomicUsize,
    /// Every POST, failed ones included.
    attempts: AtomicUsize,
}

impl Shared {
    fn messages(&self) -> MutexGuard<'_, Vec<Value>> {
        self.messages.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running webhook receiver; it stops when dropped.
#[derive(Debug)]
pub struct SlackReceiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

impl SlackReceiver {
    /// Binds `127.0.0.1:0` and serves in the background of the current tokio runtime.
    pub async fn start() -> SlackReceiver {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the Slack receiver to 127.0.0.1:0");
        let addr = listener.local_addr().expect("the Slack receiver's address");
        let shared = Arc::new(Shared::default());
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(serve(listener, shared.clone(), stop_rx));
        SlackReceiver { addr, shared, stop }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The webhook URL to put in the environment variable `approvals.slack_webhook_env`
    /// names. Shaped like Slack's, so that a leak of it in logs is recognisable.
    pub fn url(&self) -> String {
        format!(
            "http://{}/services/T0TEST/B0TEST/e2eWebhookSecret",
            self.addr
        )
    }

    /// Every JSON body accepted (answered 200) so far, in order.
    pub fn messages(&self) -> Vec<Value> {
        self.shared.messages().clone()
    }

    /// Forgets the messages so far, between phases of a test.
    pub fn clear(&self) {
        self.shared.messages().clear();
    }

    /// Waits until at least `n` messages were accepted or `timeout` (wall-clock) passed,
    /// and returns all messages so far either way: the caller asserts on the count.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let arrived = self.shared.arrived.notified();
            let messages = self.messages();
            if messages.len() >= n || Instant::now() >= deadline {
                return messages;
            }
            tokio::select! {
                _ = arrived => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    }

    /// Answers the next `n` posts with 500 (and does not keep them), as Slack does when
    /// it is having a bad day.
    pub fn fail_next(&self, n: usize) {
        self.shared.failing.store(n, Ordering::SeqCst);
    }

    /// Posts received so far, failed ones included.
    pub fn attempts(&self) -> usize {
        self.shared.attempts.load(Ordering::SeqCst)
    }
}

impl Drop for SlackReceiver {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _peer)) = accepted else {
            continue;
        };
        let shared = shared.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(request, shared.clone()));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                _ = conn => {}
            }
        });
    }
}

/// Answers as Slack's incoming webhooks do: 200 `ok`, 400 `invalid_payload`.
async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
        *response.status_mut() = status;
        Ok(response)
    };
    if request.method() != hyper::Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "invalid_method");
    }
    shared.attempts.fetch_add(1, Ordering::SeqCst);
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, "invalid_payload"),
    };
    let failing = shared
        .failing
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if failing {
        return reply(StatusCode::INTERNAL_SERVER_ERROR, "internal_error");
    }
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return reply(StatusCode::BAD_REQUEST, "invalid_payload");
    };
    shared.messages().push(message);
    shared.arrived.notify_waiters();
    reply(StatusCode::OK, "ok")
}

/// `v0=<hex HMAC-SHA256(secret, "v0:{timestamp}:{body}")>`, the `X-Slack-Signature` Slack
/// sends with a callback whose `X-Slack-Request-Timestamp` is `timestamp`.
pub fn sign(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(format!("v0:{timestamp}:{body}").as_bytes());
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

/// The `application/x-www-form-urlencoded` body of a `block_actions` callback: user
/// `user_id` pressed the button `action_id` (`approve`, `deny`, or anything else to test
/// refusals) whose value is `approval_id`. Its `response_url` points at a closed loopback
/// port, so nothing can leave the machine even if it were followed.
pub fn interaction_body(action_id: &str, approval_id: &str, user_id: &str) -> String {
    let name = format!("user-{}", user_id.to_ascii_lowercase());
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user_id, "username": name, "name": name, "team_id": "T0TEST"},
        "api_app_id": "A0TEST",
        "token": "legacy-verification-token",
        "container": {
            "type": "message",
            "message_ts": "1700000000.000100",
            "channel_id": "C0TEST",
            "is_ephemeral": false
        },
        "trigger_id": "1700000000.0000.e2e",
        "team": {"id": "T0TEST", "domain": "ostiary-e2e"},
        "enterprise": null,
        "is_enterprise_install": false,
        "channel": {"id": "C0TEST", "name": "approvals"},
        "response_url": "http://127.0.0.1:9/actions/T0TEST/1/e2e",
        "actions": [{
            "action_id": action_id,
            "block_id": "decide",
            "text": {"type": "plain_text", "text": action_id, "emoji": true},
            "value": approval_id,
            "type": "button",
            "action_ts": "1700000001.000200"
        }]
    });
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

/// The `url` of every link button in a Block Kit message, in order: the review pages.
pub fn button_urls(message: &Value) -> Vec<String> {
    buttons(message)
        .filter_map(|b| b["url"].as_str().map(str::to_owned))
        .collect()
}

/// `(action_id, value)` of every button that has a value: the interactive ones.
pub fn button_values(message: &Value) -> Vec<(String, String)> {
    buttons(message)
        .filter_map(|b| {
            Some((
                b["action_id"].as_str()?.to_owned(),
                b["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

fn buttons(message: &Value) -> impl Iterator<Item = &Value> {
    message["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|block| block["type"] == "actions")
        .flat_map(|block| block["elements"].as_array().into_iter().flatten())
        .filter(|element| element["type"] == "button")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_matches_slacks_documented_example() {
        let body = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
        assert_eq!(
            sign("8f742231b10e8888abcd99yyyzzz85a5", 1_531_420_618, body),
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
    }

    #[test]
    fn interaction_body_is_a_form_with_the_payload() {
        let body = interaction_body("approve", "apr_1", "U1");
        let (key, payload) = url::form_urlencoded::parse(body.as_bytes()).next().unwrap();
        assert_eq!(key, "payload");
        let payload: Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(payload["actions"][0]["action_id"], "approve");
        assert_eq!(payload["actions"][0]["value"], "apr_1");
        assert_eq!(payload["user"]["id"], "U1");
    }
}
