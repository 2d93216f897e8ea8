//! Waiting for a held request, the two ways the proxy offers (docs/design.md §5).
//!
//! A request policy escalates is answered `202 approval_pending` and stored; once a human
//! approves, the proxy executes it exactly once and keeps the upstream's answer. The agent
//! gets that answer either from the approval's status URL on the proxy listener
//! ([`AgentClient::wait_for_approval`]: `GET /v1/approvals/{id}`, whose view carries the
//! stored response) or by re-sending the *same* request with `Ostiary-Approval: <id>`
//! ([`AgentClient::send_waiting`]). Either way `Prefer: wait=<s>` holds each ask open until
//! the outcome is known or the wait runs out (the proxy honours up to its
//! `approvals.max_wait`, 60 s by default), so waiting is a loop of such asks until a
//! deadline; the outcome is the stored answer, a refusal ([`Refusal::ApprovalDenied`] for a
//! denial or an expiry), or [`SdkError::ApprovalTimeout`].
//!
//! Re-sending never sends anything new: a retry is only ever the held request itself, so the
//! exactly-once promise holds however often the loop asks.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{RequestBuilder, Response, StatusCode, Version};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::agent::{rebuild, AgentClient};
use crate::approvals::ApprovalStatus;
use crate::call::segment;
use crate::errors::SdkError;
use crate::refusal::{Refusal, APPROVAL_HEADER, REQUEST_ID_HEADER};

/// The longest single `Prefer: wait` asked for (the proxy's default `max_wait`).
const MAX_WAIT_SECONDS: u64 = 60;
/// How long an ask may take beyond the wait it asked for before it is given up.
const READ_SLACK: Duration = Duration::from_secs(15);
/// An ask answered sooner than this while still pending is followed by a pause of this
/// length, so a proxy that does not hold asks open is not polled in a tight loop.
const MIN_ROUND: Duration = Duration::from_millis(500);

/// The deadline of one wait and the asks it still allows.
struct Wait {
    started: Instant,
    deadline: Instant,
    round: Instant,
    asked: bool,
}

impl Wait {
    fn new(timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            started: now,
            deadline: now + timeout,
            round: now,
            asked: false,
        }
    }

    /// Seconds the next ask should wait, or `None` once the deadline passed. The first ask
    /// is always made (with no wait for a zero timeout): an outcome already there is
    /// returned rather than a timeout.
    fn next_wait(&mut self) -> Option<u64> {
        let now = Instant::now();
        let left = self.deadline.saturating_duration_since(now);
        let first = !std::mem::replace(&mut self.asked, true);
        if left.is_zero() && !first {
            return None;
        }
        self.round = now;
        let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        Some(seconds.min(MAX_WAIT_SECONDS))
    }

    /// Sleep before the next ask when the last one came back at once.
    async fn pause(&self) {
        let took = self.round.elapsed();
        if took < MIN_ROUND {
            let left = self.deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep((MIN_ROUND - took).min(left)).await;
        }
    }

    fn timed_out(&self, approval_id: &str) -> SdkError {
        SdkError::ApprovalTimeout {
            approval_id: approval_id.to_owned(),
            waited: self.started.elapsed(),
        }
    }
}

/// `request` turned into an ask that waits up to `seconds`.
fn waiting(request: RequestBuilder, seconds: u64) -> RequestBuilder {
    if seconds == 0 {
        return request;
    }
    request
        .header("prefer", format!("wait={seconds}"))
        .timeout(Duration::from_secs(seconds) + READ_SLACK)
}

impl AgentClient {
    /// Send `request`; when it is held for approval, re-send it with `Ostiary-Approval`
    /// until a human decided or `timeout` passed. The outcome is the upstream's answer to
    /// the request executed once (with `Ostiary-Approval: <id>`), the refusal
    /// ([`Refusal::ApprovalDenied`] when denied or expired), or
    /// [`SdkError::ApprovalTimeout`]. A request whose body is a stream cannot be re-sent and
    /// is refused before sending ([`SdkError::Config`]).
    pub async fn send_waiting(
        &self,
        request: RequestBuilder,
        timeout: Duration,
    ) -> Result<Response, SdkError> {
        let again = request.try_clone().ok_or_else(|| {
            SdkError::Config(
                "a request whose body is a stream cannot be re-sent to collect its approval"
                    .to_owned(),
            )
        })?;
        let mut wait = Wait::new(timeout);
        let approval_id = match self.send(request).await {
            Err(SdkError::Refused(refusal)) => match &*refusal {
                Refusal::ApprovalPending(held) => match held.approval_id() {
                    Some(id) => id.to_owned(),
                    None => return Err(SdkError::Refused(refusal)),
                },
                _ => return Err(SdkError::Refused(refusal)),
            },
            other => return other,
        };
        // The first ask was the request itself: the loop's are collections.
        wait.asked = true;
        loop {
            let Some(seconds) = wait.next_wait() else {
                return Err(wait.timed_out(&approval_id));
            };
            let retry = again
                .try_clone()
                .ok_or_else(|| SdkError::Config("the held request cannot be re-sent".to_owned()))?
                .header(APPROVAL_HEADER, approval_id.as_str());
            match self.send(waiting(retry, seconds)).await {
                Err(SdkError::Refused(refusal))
                    if matches!(*refusal, Refusal::ApprovalPending(_)) =>
                {
                    wait.pause().await
                }
                other => return other,
            }
        }
    }

    /// Wait up to `timeout` for the outcome of approval `approval_id` (from a
    /// [`Refusal::ApprovalPending`]), reading its status on the proxy listener. Executed:
    /// the upstream's stored answer, as a response (status, headers, body; with
    /// `Ostiary-Approval: <id>`, and `Ostiary-Truncated: true` when the stored body was cut
    /// at the proxy's limit). Denied or expired: [`Refusal::ApprovalDenied`]; approved but
    /// refused at execution: [`Refusal::Denied`]; failed: [`Refusal::Upstream`]. Still
    /// undecided at the deadline: [`SdkError::ApprovalTimeout`]. An id this session did not
    /// get is [`Refusal::BadRequest`] (reason `approval_unknown`).
    pub async fn wait_for_approval(
        &self,
        approval_id: &str,
        timeout: Duration,
    ) -> Result<Response, SdkError> {
        let url = format!(
            "{}/v1/approvals/{}",
            self.proxy_base,
            segment(approval_id, "an approval id")?
        );
        let mut wait = Wait::new(timeout);
        loop {
            let Some(seconds) = wait.next_wait() else {
                return Err(wait.timed_out(approval_id));
            };
            let ask = self
                .http
                .get(&url)
                .header(reqwest::header::ACCEPT, "application/json");
            let response = self.send(waiting(ask, seconds)).await?;
            let request_id = response
                .headers()
                .get(REQUEST_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let view: Value = response.json().await.map_err(|e| {
                SdkError::Decode(format!("the status of approval {approval_id}: {e}"))
            })?;
            if let Some(outcome) = outcome(approval_id, &view, request_id.as_deref()) {
                return outcome;
            }
            wait.pause().await;
        }
    }
}

/// What a final approval view stands for, or `None` while a human may still decide.
fn outcome(
    approval_id: &str,
    view: &Value,
    request_id: Option<&str>,
) -> Option<Result<Response, SdkError>> {
    let Some(status) = view.get("status").and_then(Value::as_str) else {
        return Some(Err(SdkError::Decode(format!(
            "the status of approval {approval_id} has no status"
        ))));
    };
    let text = |name: &str| view.get(name).and_then(Value::as_str);
    // The refusal a collecting retry would get, worded as the proxy words it.
    let refusal = |status: u16, body: Value| {
        Refusal::from_body(Some(status), &body, request_id)
            .map(|refusal| Err(SdkError::Refused(Box::new(refusal))))
    };
    match ApprovalStatus::from(status.to_owned()) {
        ApprovalStatus::Pending | ApprovalStatus::Approved | ApprovalStatus::Executing => None,
        ApprovalStatus::Executed => Some(stored(approval_id, view)),
        ApprovalStatus::Denied => refusal(
            403,
            json!({
                "error": "approval_denied",
                "message": format!(
                    "The approver {} denied this request.",
                    text("approver").unwrap_or("(unknown)")
                ),
                "approval_id": approval_id,
                "approver": text("approver"),
                "reason": text("reason"),
            }),
        ),
        ApprovalStatus::Expired => refusal(
            403,
            json!({
                "error": "approval_expired",
                "message": "Nobody approved this request before its deadline; it was not executed.",
                "approval_id": approval_id,
                "approver": null,
            }),
        ),
        done @ (ApprovalStatus::Refused | ApprovalStatus::Failed) => {
            let failed = done == ApprovalStatus::Failed;
            let reason = text("reason").unwrap_or("no reason recorded");
            refusal(
                if failed { 502 } else { 403 },
                json!({
                    "error": if failed { "upstream_error" } else { "denied" },
                    "message": format!("The request was approved but not executed: {reason}."),
                    "approval_id": approval_id,
                    "status": status,
                    "reason": reason,
                    "policies": [],
                }),
            )
        }
        ApprovalStatus::Other(other) => Some(Err(SdkError::Decode(format!(
            "approval {approval_id} is in a state this SDK does not know: {other:?}"
        )))),
    }
}

/// The upstream's answer the proxy stored for an executed approval.
fn stored(approval_id: &str, view: &Value) -> Result<Response, SdkError> {
    let bad = |what: &str| {
        SdkError::Decode(format!(
            "approval {approval_id} is executed but its stored response {what}"
        ))
    };
    let response = view.get("response").ok_or_else(|| bad("is missing"))?;
    let status = response
        .get("status")
        .and_then(Value::as_u64)
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| bad("has no status"))?;
    let body = match (
        response.get("body").and_then(Value::as_str),
        response.get("body_base64").and_then(Value::as_str),
    ) {
        (Some(text), _) => Bytes::from(text.to_owned()),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map(Bytes::from)
            .map_err(|_| bad("body is not base64"))?,
        (None, None) => Bytes::new(),
    };
    let mut headers = HeaderMap::new();
    for pair in response
        .get("headers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(name), Some(value)) = (
            pair.get(0).and_then(Value::as_str),
            pair.get(1).and_then(Value::as_str),
        ) else {
            continue;
        };
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(name, value);
        }
    }
    // The body is whole here, whatever framing the upstream used.
    headers.remove(reqwest::header::TRANSFER_ENCODING);
    headers.remove(reqwest::header::CONTENT_LENGTH);
    if let Ok(id) = HeaderValue::from_str(approval_id) {
        headers.insert(APPROVAL_HEADER, id);
    }
    if response.get("truncated").and_then(Value::as_bool) == Some(true) {
        headers.insert("ostiary-truncated", HeaderValue::from_static("true"));
    }
    Ok(rebuild(status, Version::HTTP_11, headers, body))
}
