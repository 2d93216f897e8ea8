//! The answer to the agent once the pipeline is done: the response, or the refusal rendered
//! by [`crate::respond`], with the request's audit record finished (and flushed before a
//! `202` promises a hold).

use http::header::CONNECTION;
use http::{Response, StatusCode};

use crate::audit::AuditGuard;
use crate::body::ProxyBody;
use crate::error::ProxyError;
use crate::plane::DataPlane;
use crate::respond;

/// When the agent's HTTP/1 connection ends with the answer (`Connection: close`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Close {
    /// An upgrade (or a CONNECT inside a tunnel) was asked: unless it was granted, the
    /// connection's next bytes would go unchecked by the wire guard.
    pub upgrade_asked: bool,
    /// The request has a body, which a refusal may not have read.
    pub carries_body: bool,
}

/// The response to the agent, with the request's audit record finished.
pub(super) async fn answer(
    plane: &DataPlane,
    result: Result<Response<ProxyBody>, ProxyError>,
    mut audit: AuditGuard,
    request_id: &str,
    close: Close,
) -> Response<ProxyBody> {
    let Close {
        upgrade_asked,
        carries_body,
    } = close;
    match result {
        Ok(mut response) => {
            if upgrade_asked && response.status() != StatusCode::SWITCHING_PROTOCOLS {
                response
                    .headers_mut()
                    .insert(CONNECTION, http::HeaderValue::from_static("close"));
            }
            audit.allow(response.status().as_u16());
            response
        }
        Err(err) => {
            let mut response = respond::error(&err, request_id);
            if upgrade_asked || carries_body {
                response
                    .headers_mut()
                    .insert(CONNECTION, http::HeaderValue::from_static("close"));
            }
            tracing::info!(request_id, error = %err, "request refused");
            if let ProxyError::LimitExceeded(hit) = &err {
                plane.metrics.limit_exceeded(&hit.limit);
            }
            // An exfiltration attempt names the credential whose placeholder it carried, so
            // `audit query` can find every attempt on one credential.
            if let ProxyError::PlaceholderExfiltration { credential, .. } = &err {
                audit.update(|r| r.credentials = vec![credential.clone()]);
            }
            let held = holds_approval(&err);
            audit.refuse(&err, response.status().as_u16());
            // A 202 promises the request is held: its record is on disk before the agent
            // hears so, or a crash right after could leave an approval the audit never saw.
            if held {
                plane.audit.flush().await;
            }
            response
        }
    }
}

/// Whether a refusal tells the agent that a request is now held for approval.
fn holds_approval(err: &ProxyError) -> bool {
    match err {
        ProxyError::ApprovalPending { .. } => true,
        ProxyError::McpRefused { replies, .. } => replies
            .iter()
            .any(|r| matches!(r.error, ProxyError::ApprovalPending { .. })),
        _ => false,
    }
}
